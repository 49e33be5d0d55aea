"""User-space settings for ROCm on an RDNA1 board, as data: the profiles the experiment matrix tries and
`profile install` writes, and where an environment can be set on a system (read by doctor).

Takes nothing from the earlier stages. Leaves Profile definitions (profiles.toml beside this file) and the
assignments of environment variables found in a system's and a user's files. Keeps no state of its own:
an installed profile is the install stage's (journaled) business.
"""
