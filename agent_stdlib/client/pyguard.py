"""What a Python validation column's code runs under (``run = true``): the source of the
child's entry point, run as ``python -I -S -c GUARD`` in the scratch folder that holds
``main.py``.

Before it runs ``main.py`` the guard takes the network away twice:

* it moves the process into a network namespace of its own (``unshare(CLONE_NEWNET)``,
  or with ``CLONE_NEWUSER`` where unprivileged user namespaces are allowed): there only a
  loopback that is down exists, so no address, not even the node's own, is reachable — for
  the code and for anything it starts;
* it installs an audit hook (:func:`sys.addaudithook`, which Python code cannot remove)
  that refuses every socket operation, starting a process (``subprocess``, ``os.system``,
  ``os.exec*``, ``os.posix_spawn``, ``os.fork``) and loading C code through ``ctypes`` —
  so the network stays closed where the kernel refuses the namespace.

Neither is a security boundary against code written to escape (an extension module or
``_posixsubprocess`` called directly is not audited); it stops model-written code from
reaching the network by accident or by habit.
"""

REFUSED_EVENTS = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn",
                  "os.spawn", "os.fork", "os.forkpty", "ctypes.")

GUARD = f"""
import ctypes, runpy, sys

def _own_network():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    for flags in (0x40000000, 0x40000000 | 0x10000000):  # CLONE_NEWNET (| CLONE_NEWUSER)
        if libc.unshare(flags) == 0:
            return True
    return False

_own_network()
_REFUSED = {REFUSED_EVENTS!r}

def _refuse(event, args):
    if event.startswith(_REFUSED):
        raise PermissionError("validation code may not use the network, start a process "
                              "or load C code (" + event + ")")

sys.addaudithook(_refuse)
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""
