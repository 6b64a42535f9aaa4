"""C kernels for the CPU's decode path, built on first use (build.py) and called through ctypes;
every caller keeps a torch path for when they are unavailable."""
