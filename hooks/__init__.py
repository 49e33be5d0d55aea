# Data folder shipped inside the rdna1_kmgr package (see pyproject.toml); no Python code here.
