"""The shared basics every stage stands on: error kinds and exit codes, where state lives, output for
scripts, durable file writes, cache entries that exist whole or not at all (and their locks), progress lines,
checks of user input, and the one runner of external programs.

Takes nothing from the flow and leaves nothing in it; imports nothing from the stages.
State roots (paths.py): /var/lib/rdna1-kmgr, /var/cache/rdna1-kmgr, /var/log/rdna1-kmgr, each movable by an
environment variable (RDNA1_KMGR_STATE, RDNA1_KMGR_CACHE, RDNA1_KMGR_LOG).
"""
