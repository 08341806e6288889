#!/usr/bin/env bash
# tests/harness/check_plan_cli.sh BENCH SOURCE_DIR — numeric flags of `plan` and `generate serving`
# (issue 27): a number past a flag's range is an error naming the flag, the value and the accepted
# range (CLI11 alone saturated 99999999999999999999 to 2^63 - 1 and wrapped -1 to 2^64 - 1), and a
# config key of the wrong JSON type is named as such. Bounded: every command fails at once or plans
# without the replay (--no-check).
set -uo pipefail
bench=$1
src=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_plan_cli: FAIL: $*"; exit 1; }
model=$src/data/models/Llama-3.1-8B-Instruct.config.json
requests=$src/data/requests/azure_llm_inference_trace_2023_conv.csv
expect_error() {  # expect_error NEEDLE ARGS...: the command fails and says NEEDLE
  local needle=$1; shift
  local err
  err=$("$bench" "$@" 2>&1) && fail "accepted: $*"
  grep -qF -- "$needle" <<<"$err" || fail "$* did not say '$needle': $err"
}
gen=(generate serving --requests "$requests" --model "$model" -o "$work/t.csv" --limit 5)
expect_error "--tenant-split: 99999999999999999999 is out of range; accepted 0 (no split) to 1099511627776" \
  "${gen[@]}" --tenant-split 99999999999999999999
expect_error "--tenant-split: 1099511627777 is out of range" "${gen[@]}" --tenant-split 1099511627777
expect_error "--limit: 99999999999999999999 is out of range" "${gen[@]}" --limit 99999999999999999999
expect_error "--kv-pool-tokens: -1 is out of range" "${gen[@]}" --kv-pool-tokens -1
expect_error "--seed: -1 is not accepted" "${gen[@]}" --seed -1
expect_error "--max-num-seqs: 4294967297 is out of range" "${gen[@]}" --max-num-seqs 4294967297
expect_error "--tiers: 0x200 is not a whole number" "${gen[@]}" --tiers 256,0x200
expect_error "--time-scale: 1e-999 is out of the range of a double" "${gen[@]}" --time-scale 1e-999
expect_error "--step-base-ms 1e+300: accepted 0 to 1e6" "${gen[@]}" --step-base-ms 1e300
# In range: read as written (a leading 0 is not octal: 010 tokens is ten).
out=$("$bench" "${gen[@]}" --kv-layout growth --growth-tokens 010 --tenant-split 1099511627776) || fail "in range"
python3 -c "
import json; m = json.load(open('$work/t.meta.json'))['options']
assert m['growth_tokens'] == 10 and m['tenant_split_tokens'] == 1099511627776, m
" || fail "growth-tokens 010 or tenant-split 2^40 was not read as written"

plan=(plan --model "$model" --card 80GiB --no-check)
expect_error "--max-model-len 2147483647: accepted 0 (from the profile) or 2 to the model's max_position_embeddings (131072" \
  "${plan[@]}" --max-model-len 2147483647
expect_error "--max-model-len: 99999999999 is out of range" "${plan[@]}" --max-model-len 99999999999
expect_error "--gpu-memory-utilization 1e-300: accepted a fraction from 0.01 to 1" "${plan[@]}" --gpu-memory-utilization 1e-300
expect_error "--gpu-memory-utilization: nan is not a number" "${plan[@]}" --gpu-memory-utilization nan
expect_error "--tensor-parallel: 4294967297 is out of range; accepted 1 to 1024" "${plan[@]}" --tensor-parallel 4294967297
expect_error "--check-requests: 99999999999999999999 is out of range" "${plan[@]}" --check-requests 99999999999999999999
expect_error "--max-batched-tokens: 2097152 is out of range; accepted 1 to 1048576" "${plan[@]}" --max-batched-tokens 2097152
expect_error "--card 65TiB: accepted a size above 0 and up to 64TiB" plan --model "$model" --card 65TiB --no-check
expect_error "--runtime-reserve 1000000TiB" "${plan[@]}" --runtime-reserve 1000000TiB
# The planner names its options as PlanOptions does (max_model_len, tensor_parallel, ...); the
# command line names them as its flags.
expect_error "--max-model-len 16: every request of the profile is longer" \
  "${plan[@]}" --max-model-len 16 --requests "$requests"
expect_error "--tensor-parallel 3: LlamaForCausalLM has 32 attention heads; accepted a divisor of them" \
  "${plan[@]}" --tensor-parallel 3
expect_error "--dtype fp4: accepted bf16, fp16, fp8 or int4" "${plan[@]}" --dtype fp4
expect_error "--dtype fp4: accepted bf16, fp16, fp8 or int4" "${gen[@]}" --dtype fp4
expect_error "--tensor-parallel 3: LlamaForCausalLM has 32 attention heads" "${gen[@]}" --tensor-parallel 3
# A card as large as the planner accepts: planned, its replay skipped by name, not failed.
out=$("$bench" plan --model "$model" --card 3TiB --requests "$requests" --check-requests 20) || fail "--card 3TiB: $out"
grep -qF "not checked by replay: --card 3072.00 GiB" <<<"$out" || fail "--card 3TiB: no note naming the card: $out"
# Config keys of the wrong type, and a limit of the config named by its key.
printf '{"model_type":7,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":1000}' >"$work/c.json"
expect_error "c.json: \"model_type\" must be a string (llama, mistral, qwen2, qwen3, phi3), got a number (7)" \
  plan --model "$work/c.json" --card 80GiB --no-check
printf '{"model_type":"llama","torch_dtype":16,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":1000}' >"$work/c.json"
expect_error "\"torch_dtype\" must be a string" plan --model "$work/c.json" --card 80GiB --no-check
printf '{"model_type":"llama","max_position_embeddings":1,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":1000}' >"$work/c.json"
expect_error "c.json: \"max_position_embeddings\" is 1" plan --model "$work/c.json" --card 80GiB
echo "check_plan_cli: OK"
