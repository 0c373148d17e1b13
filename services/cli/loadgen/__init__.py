"""The load generator behind `pagedserve bench`: workloads, a streaming SSE client, latency
statistics, engine-status sampling, plots and the Hugging Face baseline. It lives in the
product so that `pagedserve bench` needs nothing from `benchmarks/`; the benchmarks import it."""
