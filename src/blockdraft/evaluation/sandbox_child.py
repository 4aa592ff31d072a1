"""Child of `sandbox.run_python`: `python -I sandbox_child.py DIR PROGRAM TIMEOUT landlock|audit-hook`.

Confines itself to writing inside DIR (Landlock where the kernel has it, else an audit hook),
caps CPU time, memory and file size, announces the mechanism on stderr, then runs PROGRAM.
Only the standard library: it runs before anything else is imported.
"""

import ctypes
import os
import resource
import sys

# Landlock filesystem rights (linux/landlock.h); the write side is what we handle (deny by default)
WRITE_FILE, REMOVE_DIR, REMOVE_FILE = 1 << 1, 1 << 4, 1 << 5
MAKE_ANY = sum(1 << i for i in range(6, 13))        # char, dir, reg, sock, fifo, block, sym
REFER, TRUNCATE = 1 << 13, 1 << 14                   # ABI 2, ABI 3
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
PR_SET_NO_NEW_PRIVS = 38


def landlock(directory: str) -> bool:
    """Deny filesystem writes outside `directory` (and /dev/null) to this process and its children."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))   # ..._VERSION
    if abi < 1:
        return False
    handled = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_ANY | (REFER if abi >= 2 else 0) | \
        (TRUNCATE if abi >= 3 else 0)
    attr = ctypes.c_uint64(handled)                                  # struct landlock_ruleset_attr (v1 prefix)
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return False

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    for path, rights in ((directory, handled), ("/dev/null", WRITE_FILE | (TRUNCATE if abi >= 3 else 0))):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(rights, fd)
        if libc.syscall(SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        os.close(fd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)
    return True


def audit_hook(directory: str) -> None:
    """Without Landlock: refuse writes outside `directory`, new processes and ctypes from Python code."""
    root = os.path.realpath(directory) + os.sep
    path_events = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.truncate",
                   "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
    banned = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
              "ctypes.", "os.startfile", "pty.spawn")

    def inside(path) -> bool:
        if isinstance(path, int):
            return True
        return os.path.realpath(os.fsdecode(path)).startswith(root) or os.fsdecode(path) == "/dev/null"

    def hook(event, args):
        if event == "open" and args and args[0] is not None:
            mode, flags = args[1], args[2] if len(args) > 2 else 0
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & (os.O_WRONLY | os.O_RDWR))
            if writes and not inside(args[0]):
                raise PermissionError(f"sandbox: write outside {directory}: {args[0]!r}")
        elif event in path_events and args and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes))):
            raise PermissionError(f"sandbox: {event} outside {directory}")
        elif event.startswith(banned):
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(hook)


def main() -> None:
    directory, program, timeout, wanted = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    try:
        mechanism = "landlock" if wanted == "landlock" and landlock(directory) else None
    except OSError as e:
        print(f"blockdraft-sandbox:failed: {e}", file=sys.stderr, flush=True)
        sys.exit(97)
    if mechanism is None:
        audit_hook(directory)
        mechanism = "audit-hook"
    cpu = int(timeout) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    print(f"blockdraft-sandbox:{mechanism}", file=sys.stderr, flush=True)
    source = open(program).read()
    sys.argv = [program]
    exec(compile(source, program, "exec"), {"__name__": "__main__", "__file__": program})


if __name__ == "__main__":
    main()
