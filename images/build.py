"""Build and push gptpipe's images with docker buildx, then pin them in images/digests.json.

    python images/build.py build --registry ghcr.io/you [--revision SHA] [--version V]
    python images/build.py pin-base       # re-pin images/bases.json and deploy/ to today's digests

Both images come from the one images/Dockerfile, built with each base of images/bases.json.
bases.json also pins the TF Serving images that deploy/serving/ runs as they are; the manifests
there name them by the same reference, which pin-base rewrites with bases.json.

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
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOCK = HERE / "digests.json"
DOCKERFILE = HERE / "Dockerfile"
BASES = HERE / "bases.json"  # name -> an upstream image, pinned by digest
IMAGES = ("pipeline", "trainer")  # built here, each from its base in bases.json
# Run unchanged by deploy/serving/, and pinned in bases.json too.
SERVING_IMAGES = ("serving", "serving-gpu")
DEPLOY = REPO / "deploy"  # manifests that name images of bases.json, which pin-base re-pins
PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
DIGEST_RE = re.compile(r"@(sha256:[0-9a-f]{64})$")


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


def read_bases(path: Path = BASES) -> dict[str, str]:
    """The base image of each image, from images/bases.json; every image must have one."""
    bases = json.loads(path.read_text())
    missing = [name for name in IMAGES if not bases.get(name)]
    if missing:
        raise BuildError(f"{path}: no base image for {', '.join(missing)}")
    return {name: str(bases[name]) for name in IMAGES}


def read_pins(path: Path = BASES) -> dict[str, str]:
    """Every image of images/bases.json: the built images' bases and the serving images."""
    pins = json.loads(path.read_text())
    missing = [name for name in IMAGES + SERVING_IMAGES if not pins.get(name)]
    if missing:
        raise BuildError(f"{path}: no image for {', '.join(missing)}")
    return {name: str(ref) for name, ref in pins.items()}


def check_base_pinned(name: str, base: str) -> None:
    """Refuse a base image that is not pinned by a real digest."""
    match = DIGEST_RE.search(base)
    if match is None:
        raise BuildError(
            f"{BASES.name}: the {name} base {base!r} is not pinned by digest; "
            "run `make pin-base-images`"
        )
    if match[1] == PLACEHOLDER_DIGEST:
        raise BuildError(
            f"{BASES.name}: the {name} base {base!r} still has the placeholder digest; "
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


def build(name: str, base: str, registry: str, revision: str, version: str) -> str:
    """Build and push one image from `base`; return its pinned reference."""
    check_base_pinned(name, base)
    tag = f"{registry.rstrip('/')}/gptpipe-{name}:{revision[:12]}"
    with tempfile.TemporaryDirectory() as tmp:
        metadata_file = Path(tmp) / "metadata.json"
        subprocess.run(
            [
                "docker",
                "buildx",
                "build",
                "--file",
                str(DOCKERFILE),
                "--tag",
                tag,
                "--build-arg",
                f"BASE_IMAGE={base}",
                "--build-arg",
                f"IMAGE_TITLE=gptpipe-{name}",
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


def pin_base(
    path: Path = BASES, deploy: Path = DEPLOY, resolve: Callable[[str], str] = resolve_digest
) -> None:
    """Rewrite every image in images/bases.json to `tag@<digest the tag points to now>`, and
    every manifest under deploy/ that names one of them to the same new reference."""
    pins = read_pins(path)
    moved = {}
    for name, ref in pins.items():
        tag = ref.split("@", 1)[0]
        pins[name] = f"{tag}@{resolve(tag)}"
        moved[ref] = pins[name]
        print(f"{name}: {pins[name]}")
    path.write_text(json.dumps(pins, indent=2) + "\n")
    for manifest in repin_manifests(moved, deploy):
        print(f"re-pinned {manifest}")


def repin_manifests(moved: dict[str, str], deploy: Path = DEPLOY) -> list[Path]:
    """Replace each old reference of `moved` by its new one in the YAML files under `deploy`,
    as text, so comments and layout stay; return the files changed."""
    changed = []
    for manifest in sorted(deploy.rglob("*.yaml")):
        text = original = manifest.read_text()
        for old, new in moved.items():
            text = text.replace(old, new)
        if text != original:
            manifest.write_text(text)
            changed.append(manifest)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build, push and lock every image")
    b.add_argument("--registry", required=True, help="e.g. ghcr.io/you")
    b.add_argument("--revision", required=True, help="git commit: OCI revision label, code_version")
    b.add_argument("--version", default="0.1.0", help="OCI version label")
    sub.add_parser("pin-base", help="pin images/bases.json and deploy/ to the current digests")
    args = parser.parse_args(argv)
    try:
        if args.command == "pin-base":
            pin_base()
            return 0
        bases = read_bases()
        for name, base in bases.items():  # all of them before building any
            check_base_pinned(name, base)
        refs = {
            name: build(name, bases[name], args.registry, args.revision, args.version)
            for name in IMAGES
        }
        write_lock(refs)
        print(f"wrote {LOCK.relative_to(REPO)}: {refs}")
        return 0
    except BuildError as err:
        print(f"images/build.py: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
