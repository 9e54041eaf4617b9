#!/usr/bin/python3
"""Wait until no process holds the given apt/dpkg lock files (gpuprov, gpu_preflight).

Looks at /proc/locks instead of taking the locks, so it never races apt. A lock is the
file's device and inode both: nodes made from one image (containers, clones) have the same
inode numbers on other devices. Exit 0 when all are free (saying whom it waited for, if
anyone); exit 3 after --timeout seconds, its last line naming the holder's pid and command.
"""
import argparse
import os
import sys
import time


def holders(paths):
    inodes = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        inodes[(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)] = path
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
                try:
                    major, minor, inode = dev.split(":")
                    key = (int(major, 16), int(minor, 16), int(inode))
                except ValueError:
                    continue
                if key in inodes:
                    found.append((inodes[key], pid, comm(pid)))
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
    start = time.monotonic()
    deadline = start + args.timeout
    waited_for = None
    while True:
        held = holders(args.locks)
        if not held:
            if waited_for:
                path, pid, cmd = waited_for
                print(f"waited {time.monotonic() - start:.0f}s for pid {pid} ({cmd}) to release {path}")
            else:
                print("apt/dpkg locks are free")
            return 0
        if waited_for is None:
            waited_for = held[0]
            path, pid, cmd = waited_for
            print(f"{path} is held by pid {pid} ({cmd}); waiting up to {args.timeout:.0f}s", flush=True)
        if time.monotonic() >= deadline:
            path, pid, cmd = held[0]
            # On stdout, the last line: a remote stderr also carries the SSH client's words.
            print(f"{path} still held after {args.timeout:.0f}s by pid {pid} ({cmd}); "
                  "wait for it to finish or stop it, then run again", flush=True)
            return 3
        time.sleep(min(2.0, max(0.2, deadline - time.monotonic())))


if __name__ == "__main__":
    sys.exit(main())
