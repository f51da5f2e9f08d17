"""A cloud in a box: EC2 (moto's, with IAM and STS) on a lab bridge, and behind each instance a
host that shares nothing with the laptop (``fabric.py``), so that Ray's cluster launcher and the
product's AWS path run end to end on this machine with no AWS account.

    sudo .venv/bin/python -m tests.cloudbox     # (``make cloudbox``) prints the exports, runs till ^C

``box.start()`` makes it for a test; ``Box.down()`` removes every host, route and namespace it made.
"""

from .box import Box, overlaps, start

__all__ = ["Box", "overlaps", "start"]
