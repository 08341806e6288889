#!/usr/bin/env bash
# tests/harness/check_snapshot_import.sh IMPORTER BENCH — a PyTorch-layout snapshot pickle (made here
# with plain data, as torch.cuda.memory._dump_snapshot writes it) becomes a trace that replays; a
# pickle that references a function is refused without running it.
set -uo pipefail
importer=$1; bench=$2
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fail() { echo "check_snapshot_import: FAIL: $*"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import pickle, sys, os
work = sys.argv[1]
MiB = 1 << 20
def e(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}
traces = [[e("segment_alloc", 0x1000000, 20 * MiB, 1), e("alloc", 0x1000000, 3 * MiB, 2),
           e("alloc", 0x1300000, 5 * MiB, 3), e("free_requested", 0x1000000, 3 * MiB, 4),
           e("free_completed", 0x1000000, 3 * MiB, 5), e("free_completed", 0x9999999, 1 * MiB, 6)]]
snapshot = {"segments": [], "device_traces": traces, "allocator_settings": {}}
pickle.dump(snapshot, open(os.path.join(work, "snap.pickle"), "wb"))
class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.path.join(work, "pwned"),))
pickle.dump({"device_traces": [Evil()]}, open(os.path.join(work, "evil.pickle"), "wb"))
# Entries a replay would refuse: a negative size, a huge one, a string address, an alloc at 0.
for name, entry in [("neg", e("alloc", 0x1000, -5, 1)), ("huge", e("alloc", 0x1000, 1 << 64, 1)),
                    ("str", e("alloc", "0x1000", 5, 1)), ("zero", e("alloc", 0, 4096, 1))]:
    pickle.dump({"device_traces": [[entry]]}, open(os.path.join(work, name + ".pickle"), "wb"))
PY
/usr/bin/python3 "$importer" "$work/snap.pickle" -o "$work/t.csv" || fail "import"
cat "$work/t.csv"
(($(grep -c allocate "$work/t.csv") == 2 && $(grep -c ",free," "$work/t.csv") == 1)) || fail "expected 2 allocations and 1 free"
out=$("$bench" replay "$work/t.csv" --capacity 64MiB) || fail "the imported trace does not replay"
grep -q "peak live *8.00 MiB" <<<"$out" || fail "peak live should be 8 MiB: $out"
err=$(/usr/bin/python3 "$importer" "$work/evil.pickle" -o "$work/e.csv" 2>&1) && fail "a hostile pickle was accepted"
grep -q "refusing to load posix.system" <<<"$err" || fail "unexpected message: $err"
[[ ! -e $work/pwned ]] || fail "the hostile pickle ran code"
for bad in "neg:size is -5; accepted: an integer from 0 to 70368744177664" \
           "huge:size is 18446744073709551616" "str:addr is '0x1000'" "zero:an alloc of 4096 bytes at address 0"; do
  err=$(/usr/bin/python3 "$importer" "$work/${bad%%:*}.pickle" -o "$work/b.csv" 2>&1) && fail "${bad%%:*} was accepted"
  grep -qF "device_traces[0][0]: ${bad#*:}" <<<"$err" || fail "${bad%%:*}: unexpected message: $err"
done
echo "check_snapshot_import: PASS"
