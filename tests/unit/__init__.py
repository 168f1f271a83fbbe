"""Fast unit tests of the driver-side modules: no Ray, each well under a second."""
