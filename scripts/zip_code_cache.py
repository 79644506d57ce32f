"""The test nodes' cache of code compiled from zip files, by the hash of its source.

Ansible sends every module as a new zip (AnsiballZ) and Python compiles zipped sources at each import without
keeping the result: about half of a module's CPU in a podman node (ansible.module_utils.basic and what it imports).
Mitogen's strategy sends no zips; the connection it does not take over (podman_pipelined: molecule fleet, and any run
with ANSIBLE_STRATEGY=linear) does. The node image (scripts/build-node-image.sh) installs it with
`python3 zip_code_cache.py ROOT`: a .pth file imports it at every start of python3 there; the modules themselves run
unchanged.
"""
import hashlib
import marshal
import os
import sys
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


def install(root):
    """Install this module and the .pth file that loads it into the Debian python3 of the tree at root."""
    import shutil  # here: every python3 start in a node imports this module

    site = os.path.join(root, "usr", "lib", "python3", "dist-packages")
    shutil.copyfile(__file__, os.path.join(site, "llmtune_zip_code_cache.py"))
    with open(os.path.join(site, "llmtune_zip_code_cache.pth"), "w", encoding="utf-8") as pth:
        pth.write("import llmtune_zip_code_cache\n")


if __name__ == "__main__":
    install(sys.argv[1])
