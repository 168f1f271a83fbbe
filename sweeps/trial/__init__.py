"""One trial, in its own process: the trainer run, its reports judged by the rules. No Ray."""
