/* bench_dist_gloo.cc — the peer of bench_dist.c: Gloo's own allreduce
 * called directly, on a context formed the way engines/dist/gloo/ forms
 * one (FileStore + PrefixStore rendezvous, tcp device, rendezvous::Context
 * with connectFullMesh, the same timeout), so that the benchmark measures
 * what the dist.h layer adds and nothing else. C entry points; exceptions
 * end the benchmark (it is not a server). */
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "bench_dist_gloo.h"

struct bench_gloo {
	std::shared_ptr<gloo::rendezvous::Context> ctx;
	uint32_t tag = 0;
};

extern "C" struct bench_gloo *bench_gloo_open(const char *dir, int rank, int world,
					      const char *host, double timeout_s)
{
	try {
		auto *b = new bench_gloo;
		gloo::transport::tcp::attr attr;

		attr.hostname = host;
		auto dev = gloo::transport::tcp::CreateDevice(attr);
		gloo::rendezvous::FileStore fs(dir);
		gloo::rendezvous::PrefixStore store("world" + std::to_string(world), fs);

		b->ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
		b->ctx->setTimeout(std::chrono::milliseconds((int64_t)(timeout_s * 1000)));
		b->ctx->connectFullMesh(store, dev);
		return b;
	} catch (const std::exception &e) {
		fprintf(stderr, "bench_gloo_open: %s\n", e.what());
		exit(1);
	}
}

extern "C" void bench_gloo_all_reduce(struct bench_gloo *b, float *buf, size_t count)
{
	try {
		gloo::AllreduceOptions opts(b->ctx);
		void (*sum)(void *, const void *, const void *, size_t) = &gloo::sum<float>;

		opts.setOutput(buf, count);
		opts.setReduceFunction(sum);
		opts.setTag(b->tag++);
		gloo::allreduce(opts);
	} catch (const std::exception &e) {
		fprintf(stderr, "bench_gloo_all_reduce: %s\n", e.what());
		exit(1);
	}
}

extern "C" void bench_gloo_close(struct bench_gloo *b)
{
	delete b;
}
