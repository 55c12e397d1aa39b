"""Output of Slurm commands captured from the testbeds (Slurm 22.05): what the parsers and
the plan-time access checks are tested on."""

# `sacctmgr -n -P show assoc where user=root format=Account,Partition,QOS` on
# /tmp/synthbatch-testbed, and two lines of the shape a site with partition
# associations and several QOS prints.
ASSOC = "root||normal\nproj1|gpu|normal,high\nproj2||\n"
# `sacctmgr -n -P show qos format=Name` on /tmp/synthbatch-testbed.
QOS = "normal\n"
# `sacctmgr ...` on /tmp/synthbatch-testbed-noacct (exit status 1, on stderr).
NO_ACCOUNTING = ("You are not running a supported accounting_storage plugin\n"
                 "Only 'accounting_storage/slurmdbd' is supported.\n")
# `scontrol show reservation -o` on /tmp/synthbatch-testbed after `scontrol create
# reservation ReservationName=lc-capture StartTime=2030-01-01T00:00:00 Duration=1
# Users=root Accounts=root Nodes=node1` (deleted again), and with none.
RESERVATION = (
    "ReservationName=lc-capture StartTime=2030-01-01T00:00:00 EndTime=2030-01-01T00:01:00 "
    "Duration=00:01:00 Nodes=node1 NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) "
    "Flags=SPEC_NODES TRES=cpu=8 Users=root Groups=(null) Accounts=root Licenses=(null) "
    "State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n")
NO_RESERVATIONS = "No reservations in the system\n"
# `sinfo -N -h -p debug -o '%N|%f'` on the testbed (no features), and with features.
FEATURES = "node1|(null)\nnode2|(null)\n"
FEATURES_SET = "node1|a100,ib\nnode2|h100\n"
