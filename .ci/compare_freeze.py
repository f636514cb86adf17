"""Compare two `pip freeze` outputs: exit 1 when a package of the first moved down or went away in
the second, except the packages OLMo-core's own requirements cap (each printed with its cause).

    python .ci/compare_freeze.py BEFORE AFTER
"""

import sys

from packaging.utils import canonicalize_name
from packaging.version import Version

# Caps that come with OLMo-core 3.0.0 itself (its requirements and cached-path's, which it
# requires): installing the project beside a newer version moves these down whatever the project
# asks for.
OLMO_CORE_CAPS = {
    "huggingface-hub": "cached-path 1.8.10 (OLMo-core's) requires huggingface-hub < 2",
    "rich": "cached-path 1.8.10 (OLMo-core's) requires rich < 14",
    "filelock": "OLMo-core 3.0.0 and cached-path 1.8.10 require filelock < 4",
}


def read(path):
    versions = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#") and "==" in line:
            name, version = line.split("==", 1)
            versions[canonicalize_name(name)] = Version(version.split("+")[0])
    return versions


def main(before_path, after_path):
    before, after = read(before_path), read(after_path)
    bad = []
    for name, old in sorted(before.items()):
        new = after.get(name)
        if new is None:
            bad.append(f"{name} {old} removed")
        elif new < old:
            if name in OLMO_CORE_CAPS:
                print(f"moved down, expected: {name} {old} -> {new} ({OLMO_CORE_CAPS[name]})")
            else:
                bad.append(f"{name} {old} -> {new}")
        elif new > old:
            print(f"moved up: {name} {old} -> {new}")
    added = sorted(set(after) - set(before))
    print(
        f"{len(before)} packages before, {len(added)} added, "
        f"{len(bad)} moved down beyond OLMo-core's caps"
    )
    for line in bad:
        print(f"MOVED DOWN: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
