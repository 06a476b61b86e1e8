"""Under traind-run as under torchrun: every variable torchrun gives a worker must be there (a
missing one is a KeyError, as in PyTorch's own launcher test). --fail raises inside @record, so
the exception lands in TORCHELASTIC_ERROR_FILE (and a line printed at exit, after Python's
traceback, is the log's last); --touch-dir gets a file named after RANK."""
import argparse
import atexit
import os
import pathlib
import sys

from torch.distributed.elastic.multiprocessing.errors import record

NAMES = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE",
         "WORLD_SIZE", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
         "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
         "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--touch-dir")
    args = parser.parse_args()
    # one write for all the lines: two ranks share the launcher's stdout, and line by line
    # (unbuffered, as under PYTHONUNBUFFERED) their lines would interleave mid-line
    sys.stdout.write("".join(f"{name}={os.environ[name]}\n" for name in NAMES))
    sys.stdout.flush()
    if args.fail and os.environ["RANK"] == "1":
        atexit.register(lambda: print("env_script: exiting", file=sys.stderr))
        raise RuntimeError("rank 1 was asked to fail")
    if args.touch_dir:
        pathlib.Path(args.touch_dir, os.environ["RANK"]).touch()


if __name__ == "__main__":
    main()
