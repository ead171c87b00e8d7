"""The parts of the c10d backend "hvd" (hvd.torch.distributed): the Work
objects and their futures (work.py), and torch's env:// under hvd's
launchers (launch.py)."""
