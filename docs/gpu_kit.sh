#!/usr/bin/env bash
# Makes ../shared/gpu-kit's kit smaller, so that it reaches a lent GPU
# machine in fewer calls (each call carries at most 64 MiB, and each costs
# device time): its wheels installed here for Python 3.12 (with the pip of
# any Python), TensorFlow's C++ headers left out, its two big libraries'
# static symbol tables stripped (what the dynamic linker reads stays), the
# whole site packed with xz. 15 parts of 56 MiB become 9 of 59 MiB.
#
#   bash ../shared/gpu-kit/make.sh .kit --data      # the kit, as its README says
#   bash docs/gpu_kit.sh .kit .kit2                 # the smaller one
#
# On the GPU machine, with .kit2's files in /tmp/kit (SHA256SUMS, install.sh,
# install_slim.sh, kit.tar.part-NNN):
#
#   bash /tmp/kit/install_slim.sh /tmp/kit /tmp/site && source /tmp/site/env.sh
#
# install_slim.sh unpacks the site, then runs the kit's own install.sh, which
# installs the one small wheel left in the kit, writes env.sh (the stubs,
# the machine's cuDNN and cuBLAS, CIFAR10_ARCHIVE) and checks the GPU.
set -euo pipefail
kit=${1:?usage: gpu_kit.sh KIT OUT}
out=${2:?usage: gpu_kit.sh KIT OUT}
part_mib=${PART_MIB:-59}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/x" "$stage/kit/wheels"
rm -f "$out"/kit.tar.part-* "$out"/SHA256SUMS
cat "$kit"/kit.tar.part-* | tar -C "$stage/x" -xf -

tags=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_17 manylinux2014 \
         manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
  tags+=(--platform "${p}_x86_64")
done
python3 -m pip install -q --no-index --no-deps --no-compile --ignore-requires-python \
  --disable-pip-version-check --python-version 3.12 --implementation cp \
  --only-binary=:all: "${tags[@]}" --target "$stage/site" "$stage"/x/wheels/*.whl \
  2>&1 | grep -v -e "Target directory" -e "Running pip as the 'root' user" || true
rm -rf "$stage/site/tensorflow/include" "$stage/site/bin"
strip --strip-unneeded "$stage/site/tensorflow/libtensorflow_cc.so.2" \
  "$stage/site/tensorflow/libtensorflow_framework.so.2"
tar -C "$stage/site" -cf - . | xz -T0 -8 > "$stage/kit/site.tar.xz"
# install.sh installs the kit's wheels: one small one keeps it whole.
cp "$stage"/x/wheels/six-*.whl "$stage/kit/wheels/"
cp -r "$stage/x/stubs" "$stage/kit/"
[ -f "$stage/x/cifar-10-binary.tar.gz" ] && mv "$stage/x/cifar-10-binary.tar.gz" "$stage/kit/"
tar -C "$stage/kit" -cf - . | split -b "${part_mib}M" -d -a 3 - "$out/kit.tar.part-"
(cd "$out" && sha256sum kit.tar.part-* > SHA256SUMS)
cp "$kit/install.sh" "$out/"
cat > "$out/install_slim.sh" <<'SH'
#!/usr/bin/env bash
# Unpacks docs/gpu_kit.sh's site, then runs the kit's install.sh.
set -euo pipefail
kit=$(cd "${1:?usage: install_slim.sh KIT SITE}" && pwd)
site=${2:?usage: install_slim.sh KIT SITE}
mkdir -p "$site"
cd "$kit" && sha256sum -c --quiet SHA256SUMS
cat kit.tar.part-* | tar -xOf - ./site.tar.xz | xz -dc -T0 | tar -C "$site" -xf -
bash "$kit/install.sh" "$kit" "$site"
SH
n=$(ls "$out"/kit.tar.part-* | wc -l)
echo "kit: $n parts of at most $part_mib MiB in $out ($(du -sh "$out" | cut -f1))"
