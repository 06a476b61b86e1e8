"""Writes whether torch.distributed.is_torchelastic_launched() holds into the file given."""
import sys

import torch.distributed as dist

with open(sys.argv[1], "w") as out:
    out.write(str(dist.is_torchelastic_launched()))
