#!/usr/bin/env bash
# Copy what the device runner's comparison reads, cbt-recon CN (train .txt.gz and valid, ~41 MB),
# from the shared data into device-data/ (ignored by git), so that it can travel with the checkout
# to the GPU machine, where `python3 benchmarks/device_run.py --out DIR` reads it:
#
#   bash benchmarks/device_data.sh
#
# The shared data folder is $IAA_SHARED_DATA (relative paths are taken from the current folder),
# else ../shared/data beside this checkout, else beside the main checkout of a git worktree.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${IAA_SHARED_DATA:-}" ]; then
  shared="$(cd "$IAA_SHARED_DATA" 2>/dev/null && pwd)" || {
    echo "Error: IAA_SHARED_DATA=$IAA_SHARED_DATA is not a folder" >&2
    exit 1
  }
else
  shared="$repo/../shared/data"
  common="$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)"
  if [ ! -d "$shared" ] && [ -n "$common" ] && [ -d "$(dirname "$common")/../shared/data" ]; then
    shared="$(dirname "$common")/../shared/data"
  fi
fi
source_dir="$shared/cbt-recon/CBTest/data"
for name in cbtest_CN_train.txt.gz cbtest_CN_valid_2000ex.txt; do
  if [ ! -f "$source_dir/$name" ]; then
    echo "Error: $source_dir/$name not found (set IAA_SHARED_DATA to the shared data folder)" >&2
    exit 1
  fi
done
target="$repo/device-data"
mkdir -p "$target"
cp -f "$source_dir/cbtest_CN_train.txt.gz" "$source_dir/cbtest_CN_valid_2000ex.txt" "$target/"
chmod u+w "$target"/cbtest_CN_*
du -sh "$target"
