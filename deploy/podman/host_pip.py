"""Lends the build machine's pip settings to `podman build`, at build time only.

Where the package index is reached through a TLS-intercepting proxy, or is a local directory,
pip inside the build needs the machine's CA bundle, index URLs and wheel directories. This
writes the machine's effective pip configuration (`pip config list`: files and PIP_* variables)
to DIRECTORY/pip.conf with every local path in it moved under /mnt, and prints the
`podman build` options that mount DIRECTORY on /mnt and those paths inside it, read-only, and
point the builder stage's PIP_CONFIG_FILE at the file. Nothing of it reaches the image: mounts
exist only while a RUN step runs, their mount points are made in DIRECTORY (an image's /mnt
already exists, so no step leaves an empty one behind), and the final stage takes only the
built virtualenv from the builder.

Usage: python3 deploy/podman/host_pip.py DIRECTORY [PYTHON]
PYTHON is the interpreter whose pip is asked (default: this one). Prints nothing when pip is
absent or has no settings.
"""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

MOUNT = "/mnt"
# Options whose values name local files or directories (whitespace-separated lists for some).
PATH_OPTIONS = {
    "cert",
    "client-cert",
    "constraint",
    "find-links",
    "index-url",
    "extra-index-url",
    "requirement",
}


def effective_settings(python: str) -> dict[str, str]:
    """`pip config list` merged: PIP_* variables override the files' [global] values."""
    try:
        done = subprocess.run(
            [python, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    files: dict[str, str] = {}
    env: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        section, _, name = key.rpartition(".")
        text = str(ast.literal_eval(value))
        if section == ":env:":
            env[name] = text
        elif section == "global":
            files[name] = text
        else:
            files.setdefault(name, text)  # install/download sections: same meaning in a build
    return {**files, **env}


class Mounts:
    """Local paths given a place under MOUNT, each mounted once on a mount point in directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.volumes: dict[str, str] = {}

    def place(self, host: str) -> str:
        path = Path(host)
        if not path.exists():
            return host
        resolved = str(path.resolve())
        if resolved not in self.volumes:
            name = str(len(self.volumes))
            point = self.directory / name
            point.mkdir() if path.is_dir() else point.touch()
            self.volumes[resolved] = f"{MOUNT}/{name}"
        return self.volumes[resolved]

    def rewrite(self, value: str) -> str:
        words = []
        for word in value.split():
            url = urlparse(word)
            if url.scheme == "file":
                # An index's pages link to its files relatively (`../../files/…`): the directory
                # holding the index is mounted, not only its simple/ pages.
                index = Path(unquote(url.path))
                words.append(f"file://{self.place(str(index.parent))}/{index.name}")
            elif not url.scheme and word.startswith("/"):
                words.append(self.place(word))
            else:
                words.append(word)
        return " ".join(words)


def main(directory: Path, python: str) -> None:
    settings = effective_settings(python)
    if not settings:
        return
    mounts = Mounts(directory)
    config = configparser.ConfigParser(interpolation=None)
    config["global"] = {
        name: mounts.rewrite(value) if name in PATH_OPTIONS else value
        for name, value in sorted(settings.items())
    }
    pip_conf = directory / "pip.conf"
    with pip_conf.open("w") as out:
        config.write(out)
    options = [f"--volume={directory.resolve()}:{MOUNT}:ro"]
    options += [f"--volume={host}:{inside}:ro" for host, inside in mounts.volumes.items()]
    options.append(f"--build-arg=PIP_CONFIG_FILE={MOUNT}/pip.conf")
    print("\n".join(options))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else sys.executable)
