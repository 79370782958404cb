# Sourced by the Dockerfile's build stages before pip runs: pip's settings from the build arguments and from
# this folder (README.md here). An empty build argument is unset (pip would take "" for an index).
for name in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS PIP_TRUSTED_HOST; do
    eval "value=\${$name:-}"
    if [ -z "$value" ]; then unset "$name"; else export "$name"; fi
done
if [ -s /pip/ca-bundle.crt ]; then
    export PIP_CERT=/pip/ca-bundle.crt
fi
if ls /pip/wheels/*.whl >/dev/null 2>&1; then
    export PIP_FIND_LINKS="/pip/wheels${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
fi
unset value name
