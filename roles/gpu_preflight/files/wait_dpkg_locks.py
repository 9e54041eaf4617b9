#!/usr/bin/python3
"""Wait until no process holds the given apt/dpkg lock files (gpuprov, gpu_preflight).

Looks at /proc/locks instead of taking the locks, so it never races apt.
Exit 0 when all are free; exit 3 after --timeout seconds, naming the holder.
"""
import argparse
import os
import sys
import time


def holders(paths):
    inodes = {}
    for path in paths:
        try:
            inodes[os.stat(path).st_ino] = path
        except OSError:
            continue
    found = []
    try:
        with open("/proc/locks") as fh:
            for line in fh:
                fields = line.split()
                if fields and fields[1] == "->":
                    continue  # a waiter, not a holder
                try:
                    pid, dev = fields[4], fields[5]
                except IndexError:
                    continue
                inode = int(dev.rsplit(":", 1)[1])
                if inode in inodes:
                    found.append((inodes[inode], pid, comm(pid)))
    except OSError:
        pass
    return found


def comm(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    except OSError:
        return "?"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("locks", nargs="+")
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    while True:
        held = holders(args.locks)
        if not held:
            print("apt/dpkg locks are free")
            return 0
        if time.monotonic() >= deadline:
            path, pid, cmd = held[0]
            print(f"{path} still held after {args.timeout:.0f}s by pid {pid} ({cmd}); "
                  "wait for it to finish or stop it, then run again", file=sys.stderr)
            return 3
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
