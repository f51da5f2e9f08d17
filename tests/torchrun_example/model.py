import torch


class Tiny(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
