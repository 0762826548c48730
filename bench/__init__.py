"""Benchmarks of the action stack (``cosmos3-gym bench``): latency and throughput of the pipeline
in isolation (:mod:`~cosmos3_gym.bench.latency`) and the overlap of inference with env stepping
(:mod:`~cosmos3_gym.bench.overlap`)."""
