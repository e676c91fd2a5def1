#!/usr/bin/env bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=.:/tmp/site XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
L=${L:-430}
timeout $L python3 -m lowp conformance --no-progress --json --backend numpy,torch_cuda_eager,torch_cuda_compiled > $OUT/conformance_torch.json 2> $OUT/conformance_torch.err &
a=$!
timeout $L python3 -m lowp conformance --no-progress --json --backend numpy,jax_gpu > $OUT/conformance_jax.json 2> $OUT/conformance_jax.err &
b=$!
LOWP_FUZZ_SECONDS=30 timeout $L python3 -m pytest -q -p no:cacheprovider -m "slow or not slow" -rfs --tb=short \
  tests/torch_frontend/test_grouped_mm.py tests/conformance/test_grouped_operands.py \
  tests/torch_frontend/test_cast_kernels_threads.py tests/test_fuzz_frameworks.py \
  tests/test_dialects.py $EXTRA > $OUT/tests.log 2>&1
echo "tests exit $?"; tail -25 $OUT/tests.log
wait $a; echo "conformance torch exit $?"; wait $b; echo "conformance jax exit $?"
python3 - <<'PY'
import json, os
for n in ("torch", "jax"):
    p = os.path.join(os.environ["OUT"], f"conformance_{n}.json")
    try:
        d = json.load(open(p))
    except Exception as e:
        print(n, "unreadable", e, open(p.replace(".json", ".err")).read()[-1500:]); continue
    print(n, json.dumps(d.get("summary", {k: v for k, v in d.items() if k != "cases"}))[:1500])
PY
