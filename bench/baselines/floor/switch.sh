#!/usr/bin/env bash
# The floor: the tightest hand switch, with no checks at all. ONE persistent SSH connection
# (ControlMaster, opened once before the benchmark: CONTROL_PATH) runs stop + write unit +
# daemon-reload + start as one remote command, then /health is polled every 50 ms.
# No GPU-free wait, no readiness beyond /health, no rollback, no record.
#
#   TARGET=root@gpu3 CONTROL_PATH=/tmp/cm.sock OLD_UNIT=vllm-a.service NEW_UNIT=vllm-b.service \
#   UNIT_TEXT="$(cat vllm-b.service)" HEALTH_URL=http://gpu3:8000/health bench/baselines/floor/switch.sh
set -euo pipefail
: "${TARGET:?}" "${CONTROL_PATH:?}" "${OLD_UNIT:?}" "${NEW_UNIT:?}" "${UNIT_TEXT:?}" "${HEALTH_URL:?}"

printf '%s' "$UNIT_TEXT" | ssh -S "$CONTROL_PATH" -o ControlMaster=no "$TARGET" \
  "systemctl stop $OLD_UNIT && cat > /etc/systemd/system/$NEW_UNIT && systemctl daemon-reload && systemctl start $NEW_UNIT"

until curl -sf -o /dev/null --max-time 1 "$HEALTH_URL"; do
  sleep 0.05
done
