"""The state every process shares: a cluster's spec, the registry of clusters and the kernels
attached to them, and the processes we own (started, listed and stopped by session).

Runs on: every process of ours, the laptop's and a head's alike.
May import: the ground floor.
"""
