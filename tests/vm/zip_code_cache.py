"""The test VM's cache of code compiled from zip files, by the hash of its source.

Ansible sends every module as a new zip (AnsiballZ) and Python compiles zipped sources at each import without
keeping the result: under software emulation that is most of a task's time (2.3 of 3.3 s for a stat task,
ansible.module_utils.basic and what it imports). build-image.sh installs this module with a .pth file that imports it
at every start of the guest's python3; the modules themselves run unchanged.
"""
import hashlib
import marshal
import os
import zipimport

CACHE = "/var/cache/llmtune-zip-code"
_compile = zipimport._compile_source


def _compile_source(pathname, source):
    path = os.path.join(CACHE, hashlib.sha256(source).hexdigest())
    try:
        with open(path, "rb") as cached:
            return marshal.load(cached)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile(pathname, source)
    try:
        os.makedirs(CACHE, exist_ok=True)
        part = f"{path}.{os.getpid()}"
        with open(part, "wb") as out:
            marshal.dump(code, out)
        os.replace(part, path)
    except OSError:
        pass
    return code


zipimport._compile_source = _compile_source
