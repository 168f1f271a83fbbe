"""The driver's record of every trial: histories, outcomes, objective values. No Ray."""
