/* presets.h — model configurations built into the daemon, so that tests,
 * the demo and first-time users can Initialize without any file. */
#ifndef ENGINED_DAEMON_PRESETS_H
#define ENGINED_DAEMON_PRESETS_H

/* Text of the HF config.json of preset `name`, or NULL when unknown. */
const char *preset_config_json(const char *name);
/* "tiny, small, qwen2.5-0.5b-shape" (for error messages). */
const char *preset_names(void);

#endif
