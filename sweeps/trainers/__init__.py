"""Reference trainers: plain ``train(config, report)`` functions that sweeps can run."""
