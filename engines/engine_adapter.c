/* engine_adapter.c — LoRA adapters as engines of their own: the one check
 * of an adapter's configuration, the module names, and the creation of an
 * adapter over a frozen base through the base's ops (engine.h). */
#include "engine.h"
#include "engine_calls.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora.h"
#include "optim/schedule.h"

_Static_assert(ENGINE_LORA_MODULES == LORA_MODULES, "engine.h and lora.h list the same modules");

const char *engine_lora_module_name(int i)
{
	return lora_module_name(i);
}

unsigned engine_lora_module_bits(const char *name)
{
	return lora_module_bits(name);
}

static int name_check(const char *name, struct eng_error *err)
{
	size_t n = name ? strlen(name) : 0;

	if (n == 0 || n > ENGINE_ADAPTER_NAME_MAX)
		return eng_fail(err, -EINVAL, "name: %zu characters, must be 1 to %d", n,
				ENGINE_ADAPTER_NAME_MAX);
	if (name[0] == '.')
		return eng_fail(err, -EINVAL, "name: must not start with '.'");
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return eng_fail(err, -EINVAL,
					"name: character %zu (0x%02x) is not one of [A-Za-z0-9._-]",
					i, (unsigned char)c);
	}
	return 0;
}

int engine_adapter_config_check(const struct engine_adapter_config *c, struct eng_error *err)
{
	int rc = name_check(c->name, err);

	if (rc)
		return rc;
	if (c->rank < 0 || (!c->peft_dir && c->rank == 0))
		return eng_fail(err, -EINVAL, "rank: %lld, must be >= 1", (long long)c->rank);
	if (!isfinite(c->alpha) || c->alpha < 0 || (!c->peft_dir && c->alpha == 0))
		return eng_fail(err, -EINVAL, "alpha: %g, must be finite and > 0", c->alpha);
	if (c->targets & ~(unsigned)ENGINE_LORA_ALL_LINEAR)
		return eng_fail(err, -EINVAL, "target_modules: unknown module bits 0x%x",
				c->targets);
	if (!c->peft_dir && !c->targets)
		return eng_fail(err, -EINVAL,
				"target_modules: at least one of q_proj, k_proj, v_proj, o_proj, "
				"gate_proj, up_proj, down_proj or all-linear is required");
	if (c->has_optim && (rc = engine_optim_config_check(&c->optim, err)))
		return rc;
	if (c->has_sched && (rc = lr_schedule_validate(&c->sched, err)))
		return rc;
	return 0;
}

int engine_adapter_create(struct engine *base, const struct engine_adapter_config *cfg,
			  struct engine **ret, struct eng_error *err)
{
	const struct engine_ops *bops = engine_ops_of(base), *aops = NULL;
	struct engine *ad;
	int rc = engine_adapter_config_check(cfg, err);

	if (rc)
		return rc;
	if (!bops->adapter_create)
		return eng_fail(err, -ENOSYS, "adapters: engine %s/%s/%s has none",
				bops->model_type, bops->backend, bops->device);
	ad = engine_new(bops, base);
	if (!ad)
		return eng_fail(err, -ENOMEM, "adapter: out of memory");
	rc = bops->adapter_create(base, cfg, ad, &aops, err);
	if (rc) {
		free(ad);
		return rc;
	}
	engine_set_ops(ad, aops);
	*ret = ad;
	return 0;
}

int engine_adapter_info(struct engine *e, struct engine_adapter_config *ret)
{
	const struct engine_ops *ops = engine_ops_of(e);

	if (!ops->adapter_info)
		return -EINVAL;
	return ops->adapter_info(e, ret);
}

int engine_adapter_set_view(struct engine *e, enum engine_adapter_view view,
			    struct eng_error *err)
{
	const struct engine_ops *ops = engine_ops_of(e);

	if (!ops->adapter_view)
		return eng_fail(err, -EINVAL, "adapter_view: the engine is no adapter");
	if (view != ENGINE_ADAPTER_VIEW_ADAPTER && view != ENGINE_ADAPTER_VIEW_BASE &&
	    view != ENGINE_ADAPTER_VIEW_MERGED)
		return eng_fail(err, -EINVAL, "adapter_view: unknown view %d", (int)view);
	return ops->adapter_view(e, view, err);
}

int engine_group_agree(struct engine *e, int rc, const char *what, struct eng_error *err)
{
	const struct engine_ops *ops = engine_ops_of(e);

	return ops->group_agree ? ops->group_agree(e, rc, what, err) : rc;
}
