# Sourced by the device scripts: makes `import kdtree` work. Already importable, else the wheel that
# scripts/device_python.sh installed into /tmp/site, else the carried wheel (.whl/kdtree-*.whl, built with
# `pip wheel . -w .whl --no-deps --no-build-isolation`) installed the same way. Needs $root (the checkout).
if ! python3 -c "import kdtree" 2>/dev/null; then
  _kdtree_wheel=$(ls "$root"/.whl/kdtree-*.whl 2>/dev/null | head -1)
  if [[ ! -d /tmp/site/kdtree && -n $_kdtree_wheel ]]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$_kdtree_wheel"
  fi
  [[ -d /tmp/site/kdtree ]] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
