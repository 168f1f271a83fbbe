"""The only package that imports Ray: Ray Tune runs, the searcher, schedulers, callbacks."""
