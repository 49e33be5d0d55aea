"""rdna1-kmgr: patch, build, validate and install amdgpu for first-generation RDNA GPUs."""

import os as _os

# Root's environment is the caller's (`su` keeps it whole, `sudo -E` nearly so: issue 49). Libraries this very
# process loads read some of it at their first use: OpenSSL (through hashlib, ssl) its configuration, which can
# load a provider, code that would run as root, and the certificates it trusts. The command runs `python -I`,
# which covers PYTHON*; these go before anything imports those libraries. What the tool's programs get is
# core/program_env.py's allow-list.
for _name in (
    "OPENSSL_CONF",
    "OPENSSL_CONF_INCLUDE",
    "OPENSSL_MODULES",
    "OPENSSL_ENGINES",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
):
    _os.environ.pop(_name, None)

__version__ = "0.1.0"
