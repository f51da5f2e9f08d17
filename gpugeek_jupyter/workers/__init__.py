"""run: notebook cells as distributed PyTorch jobs on a warm Ray worker group."""
