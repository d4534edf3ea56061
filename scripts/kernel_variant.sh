#!/usr/bin/env bash
# An experiment binary for an interleaved A/B on the device: build/dslab-NAME (and, with TESTS=1,
# build/dslab_tests-NAME) - the build's own dslab with one or more CUDA sources of the variants library compiled again
# with extra nvcc flags (typically -DSOME_EXPERIMENT guarding the change in those sources), relinked from the build
# tree. So one source edit yields both sides of a comparison, and the flagged code is GPU-tested by the same binary
# that is timed. Usage: scripts/kernel_variant.sh NAME [NVCC_FLAGS...]
#   SRC: the sources, relative to the project root, separated by spaces (default variants/mla/cuda/fused/sm90_bf16_h128.cu;
#   e.g. SRC="variants/mla/cuda/fused/host.cu variants/mla/cuda/fused/sm90_bf16_h128.cu" where a change spans the host and the
#   kernel); BUILD: the build tree (default build; configured and built first). Each object goes to
#   $BUILD/kernel-variants/NAME/, under its unit's own file name, so scripts/check_sass.py reads it as it reads the
#   build's.
# Then: scripts/device_bundle.sh (it bundles every executable in the build tree) and, on the device, the ab step of
# scripts/device_run.sh with BINS="dslab dslab-NAME"; scripts/ab_table.py reads what it leaves.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: scripts/kernel_variant.sh NAME [NVCC_FLAGS...]" >&2; exit 2; }
name=$1; shift
[[ $name =~ ^[A-Za-z0-9_]+$ ]] || { echo "kernel_variant.sh: NAME '$name': expected letters, digits or _ (it becomes dslab-$name)" >&2; exit 2; }
read -r -a sources <<<"${SRC:-variants/mla/cuda/fused/sm90_bf16_h128.cu}"
[ ${#sources[@]} -ge 1 ] || { echo "kernel_variant.sh: SRC '': expected one or more sources" >&2; exit 2; }
build=$(cd "$root" && realpath -m "${BUILD:-build}")
for src in "${sources[@]}"; do
  [ -f "$root/$src" ] || { echo "kernel_variant.sh: SRC '$src': no such file under $root" >&2; exit 2; }
done
for f in compile_commands.json CMakeFiles/dslab.dir/link.txt; do
  [ -f "$build/$f" ] || { echo "kernel_variant.sh: $build/$f missing: configure and build $build first (scripts/test.sh), with CUDA" >&2; exit 2; }
done
mkdir -p "$build/kernel-variants/$name"
link_edits=() tests_link_edits=()
for src in "${sources[@]}"; do
  obj="CMakeFiles/dslab_variants.dir/$src.o"
  [ -f "$build/$obj" ] || { echo "kernel_variant.sh: $build/$obj missing: configure and build $build first (scripts/test.sh), with CUDA" >&2; exit 2; }
  out="$build/kernel-variants/$name/$(basename "$src").o"  # (the unit's own file name: check_sass.py's rules go by it)
  # (the build's own command for that source, from compile_commands.json - include files, defines, the one
  # architecture, any per-file options - with the extra flags added and the object written elsewhere)
  cmd=$(python3 - "$build/compile_commands.json" "$root/$src" "$out" "$@" <<'PY'
import json, shlex, sys
db, source, out, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
entry = next((e for e in json.load(open(db)) if e['file'] == source), None)
if entry is None:
    print(f'kernel_variant.sh: {source}: not in {db} (not a source of this build)', file=sys.stderr)
    sys.exit(2)
words = shlex.split(entry['command'])
words[words.index('-o') + 1] = out
print('cd ' + shlex.quote(entry['directory']) + ' && ' + shlex.join(words + extra))
PY
  )
  sh -c "$cmd"
  link_edits+=(-e "s#$obj#$out#") tests_link_edits+=(-e "s#../$obj#$out#")
done
cd "$build"
sh -c "$(sed "${link_edits[@]}" -e "s#-o dslab #-o dslab-$name #" CMakeFiles/dslab.dir/link.txt)"
echo "built $build/dslab-$name"
if [ -n "${TESTS:-}" ]; then
  cd tests && sh -c "$(sed "${tests_link_edits[@]}" -e "s#-o dslab_tests #-o ../dslab_tests-$name #" CMakeFiles/dslab_tests.dir/link.txt)"
  echo "built $build/dslab_tests-$name"
fi
