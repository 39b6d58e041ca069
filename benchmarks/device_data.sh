#!/usr/bin/env bash
# Copy what part 2 of the device runner reads, cbt-recon CN (train .txt.gz and valid, ~41 MB),
# from the shared data into device-data/ (ignored by git), so that a device call can carry it:
#
#   bash benchmarks/device_data.sh            # reads $IAA_SHARED_DATA, default ../shared/data
#
# then carry "device-data" in the call that runs `benchmarks/device_run.py --part 2`.
set -euo pipefail
cd "$(dirname "$0")/.."
source_dir="${IAA_SHARED_DATA:-../shared/data}/cbt-recon/CBTest/data"
target=device-data/cbt-recon/CBTest/data
for name in cbtest_CN_train.txt.gz cbtest_CN_valid_2000ex.txt; do
  if [ ! -f "$source_dir/$name" ]; then
    echo "Error: $source_dir/$name not found (set IAA_SHARED_DATA to the shared data folder)" >&2
    exit 1
  fi
done
mkdir -p "$target"
cp "$source_dir/cbtest_CN_train.txt.gz" "$source_dir/cbtest_CN_valid_2000ex.txt" "$target/"
du -sh device-data
