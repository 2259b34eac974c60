# Sourced by the device scripts that run the DDTree models: makes `import kdtree` work (already importable,
# else the wheel that scripts/device_python.sh installed into /tmp/site, else the carried wheel
# (.whl/kdtree-*.whl, built with `pip wheel . -w .whl --no-deps --no-build-isolation`) installed the same
# way), and sets up the cubin cache device_python.sh uses ($KDTREE_CACHE_DIR, seeded from .carry/cache: the
# kernels it compiled are reused; trained weights go to $KDTREE_CACHE_DIR/ddtree) with training allowed
# (KDTREE_DDTREE_TRAIN=1). Needs $root (the checkout).
export PYTHONUNBUFFERED=1
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-py-cache}
export KDTREE_DDTREE_TRAIN=1
mkdir -p "$KDTREE_CACHE_DIR"
[[ -d $root/.carry/cache ]] && cp -rn "$root/.carry/cache/." "$KDTREE_CACHE_DIR/" 2>/dev/null
if ! python3 -c "import kdtree" 2>/dev/null; then
  _kdtree_wheel=$(ls "$root"/.whl/kdtree-*.whl 2>/dev/null | head -1)
  if [[ ! -d /tmp/site/kdtree && -n $_kdtree_wheel ]]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$_kdtree_wheel"
  fi
  [[ -d /tmp/site/kdtree ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
