"""Stage 11, experiment on the host: the user-space axis of "what makes Conv2d work on this board", run on
the owner's own desktop with the board as its display.

Takes: the board (host/), the owner's PyTorch (`--python`, else the builds doctor finds), the profiles
(userspace/), the backend settings and outcomes shared with the VFIO matrix (vm/cell_outcomes.py) and the
one workload (qemu/guest/conv2d.py --sweep experiment). Leaves: per run a folder under
<state>/experiments/host-<time>/ (record.json, table.html, and per cell its MIOpen caches and output), and
experiments/host-latest.json. Changes nothing on the system; `experiment apply` installs the answer through
install/user_profile.py, journaled.
"""
