#!/usr/bin/env bash
# Switch a GPU host from one vLLM unit to another the way operators script it: one ssh call per
# step, a sleep-1 poll on nvidia-smi until the GPUs are free, a curl loop until /health answers.
#
#   TARGET=root@gpu3 OLD_UNIT=vllm-a.service NEW_UNIT=vllm-b.service NEW_MODEL=b GPUS=0,1,2,3 \
#   UNIT_TEXT="$(cat vllm-b.service)" HEALTH_URL=http://gpu3:8000/health \
#   [SSH_OPTS='-i key -o UserKnownHostsFile=...'] bench/baselines/bash/switch.sh
# (The benchmark passes the unit the orchestrator renders, so every tool writes the same bytes.)
set -euo pipefail
: "${TARGET:?}" "${OLD_UNIT:?}" "${NEW_UNIT:?}" "${NEW_MODEL:?}" "${GPUS:?}" "${UNIT_TEXT:?}" "${HEALTH_URL:?}"
FREE_MIB=${FREE_MIB:-1024}

remote() { ssh ${SSH_OPTS:-} "$TARGET" "$@"; }

remote "systemctl stop $OLD_UNIT"

until remote "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits" |
      awk -F', *' -v gpus=",$GPUS," -v free="$FREE_MIB" \
          'index(gpus, "," $1 ",") && $2 + 0 >= free { busy = 1 } END { exit busy }'; do
  sleep 1
done

printf '%s' "$UNIT_TEXT" | remote "cat > /etc/systemd/system/$NEW_UNIT"

remote "systemctl daemon-reload && systemctl start $NEW_UNIT"

until curl -sf -o /dev/null --max-time 5 "$HEALTH_URL"; do
  sleep 1
done
