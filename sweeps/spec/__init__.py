"""What the user wrote: the sweep file, its search space and write-back paths, checked."""
