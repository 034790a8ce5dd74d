"""Build and push gptpipe's images with docker buildx, then pin them in images/digests.json.

    python images/build.py build --registry ghcr.io/you [--revision SHA] [--version V]
    python images/build.py pin-base       # rewrite each Dockerfile's BASE_IMAGE to today's digest

`make images REGISTRY=...` and `make pin-base-images` call this. `gptpipe compile` reads the
lock this writes (image name -> repo@sha256:...), so a cluster runs exactly what was built.
Only the stdlib is used; the pure parts (Dockerfile and metadata parsing) are tested.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOCK = HERE / "digests.json"
IMAGES = {"pipeline": HERE / "pipeline" / "Dockerfile", "trainer": HERE / "trainer" / "Dockerfile"}
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
DIGEST_RE = re.compile(r"@(sha256:[0-9a-f]{64})$")
_ARG_RE = re.compile(r"^ARG\s+(?P<name>\w+)(?:=(?P<value>\S+))?\s*$")


class BuildError(Exception):
    """A problem the person running the build can fix; printed as one line."""


def instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile as (INSTRUCTION, arguments) pairs: comments dropped, continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def base_images(text: str) -> list[str]:
    """Every FROM image with the global ARG defaults substituted, as the build would pull."""
    args: dict[str, str] = {}
    bases = []
    for keyword, rest in instructions(text):
        if keyword == "ARG" and not bases:
            match = _ARG_RE.match(f"ARG {rest}")
            if match and match["value"] is not None:
                args[match["name"]] = match["value"]
        elif keyword == "FROM":
            image = rest.split()[0]
            bases.append(re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m[1], m[0]), image))
    return bases


def check_base_pinned(dockerfile: Path) -> None:
    """Refuse a Dockerfile whose base is not pinned by a real digest."""
    for base in base_images(dockerfile.read_text()):
        match = DIGEST_RE.search(base)
        if match is None:
            raise BuildError(
                f"{dockerfile}: base image {base!r} is not pinned by digest; "
                "run `make pin-base-images`"
            )
        if match[1] == PLACEHOLDER_DIGEST:
            raise BuildError(
                f"{dockerfile}: base image {base!r} still has the placeholder digest; "
                "run `make pin-base-images` to resolve the tag to its real digest"
            )


def pinned_reference(metadata: dict) -> str:
    """`repo@sha256:...` from a `docker buildx build --metadata-file` document."""
    digest = metadata.get("containerimage.digest", "")
    names = [n for n in metadata.get("image.name", "").split(",") if n]
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest) or not names:
        raise BuildError(
            "buildx metadata has no containerimage.digest or image.name: "
            "was the image pushed (--push)?"
        )
    repo = re.sub(r":[^:/]+$", "", names[0].split("@")[0])  # drop the tag
    return f"{repo}@{digest}"


def write_lock(refs: dict[str, str], lock: Path = LOCK) -> None:
    """Write the digest lock that `gptpipe compile` reads."""
    lock.write_text(json.dumps(dict(sorted(refs.items())), indent=2) + "\n")


def build(name: str, registry: str, revision: str, version: str) -> str:
    """Build and push one image; return its pinned reference."""
    dockerfile = IMAGES[name]
    check_base_pinned(dockerfile)
    tag = f"{registry.rstrip('/')}/gptpipe-{name}:{revision[:12]}"
    with tempfile.TemporaryDirectory() as tmp:
        metadata_file = Path(tmp) / "metadata.json"
        subprocess.run(
            [
                "docker",
                "buildx",
                "build",
                "--file",
                str(dockerfile),
                "--tag",
                tag,
                "--build-arg",
                f"REVISION={revision}",
                "--build-arg",
                f"VERSION={version}",
                "--metadata-file",
                str(metadata_file),
                "--push",
                str(REPO),
            ],
            check=True,
        )
        return pinned_reference(json.loads(metadata_file.read_text()))


def resolve_digest(image: str) -> str:
    """The digest a tag points to now, from the registry (docker buildx imagetools inspect)."""
    out = subprocess.run(
        ["docker", "buildx", "imagetools", "inspect", image, "--format", "{{json .Manifest}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return str(json.loads(out)["digest"])


def pin_base(dockerfile: Path) -> None:
    """Rewrite the BASE_IMAGE default to `tag@<digest the tag points to now>`."""
    text = dockerfile.read_text()
    match = re.search(r"^ARG BASE_IMAGE=(?P<tag>[^@\s]+)(?:@\S+)?$", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{dockerfile}: no `ARG BASE_IMAGE=...` line to pin")
    pinned = f"{match['tag']}@{resolve_digest(match['tag'])}"
    dockerfile.write_text(text[: match.start()] + f"ARG BASE_IMAGE={pinned}" + text[match.end() :])
    print(f"{dockerfile.relative_to(REPO)}: {pinned}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build, push and lock every image")
    b.add_argument("--registry", required=True, help="e.g. ghcr.io/you")
    b.add_argument("--revision", required=True, help="git commit: OCI revision label, code_version")
    b.add_argument("--version", default="0.1.0", help="OCI version label")
    sub.add_parser("pin-base", help="pin each Dockerfile's base image to its current digest")
    args = parser.parse_args(argv)
    try:
        if args.command == "pin-base":
            for dockerfile in IMAGES.values():
                pin_base(dockerfile)
            return 0
        for dockerfile in IMAGES.values():  # all of them before building any
            check_base_pinned(dockerfile)
        refs = {name: build(name, args.registry, args.revision, args.version) for name in IMAGES}
        write_lock(refs)
        print(f"wrote {LOCK.relative_to(REPO)}: {refs}")
        return 0
    except BuildError as err:
        print(f"images/build.py: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
