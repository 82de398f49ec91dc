"""Models built offline for the embedded default, the tests and the benchmarks: the tiny text
model (model.py), the tiny vision and audio models (multimodal.py), and the fake engine the
scale benchmarks run without torch (fake_engine.py). Nothing in production imports these but
`bootstrap_demo`, `build_demo_model` and the runtime's `fake:` weights."""
