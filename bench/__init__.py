"""Benchmarks of the action stack (``cosmos3-gym bench``): latency and throughput of the pipeline
in isolation (:mod:`~cosmos3_gym.bench.latency`) and the overlap of inference with env stepping
(:mod:`~cosmos3_gym.bench.overlap`); both it and ``cosmos3-gym size``
(:mod:`~cosmos3_gym.bench.synthetic`) compare two calls the same way
(:mod:`~cosmos3_gym.bench.paired`)."""
