#!/usr/bin/env bash
# A complete batch workflow with curl and jq (docs/GUIDE.md).
#   BOARDWALK_BASE_URL=http://127.0.0.1:8000/v1 BOARDWALK_API_KEY=bw_... \
#     docs/examples/batch.sh requests.jsonl [OUT_DIR]
set -euo pipefail
IN=${1:?usage: batch.sh requests.jsonl [OUT_DIR]}
OUT=${2:-.}
BASE=${BOARDWALK_BASE_URL:-http://127.0.0.1:8000/v1}
AUTH="Authorization: Bearer ${BOARDWALK_API_KEY:?set BOARDWALK_API_KEY}"
api() { curl --fail --silent --show-error -H "$AUTH" "$@"; }

FILE_ID=$(api -F purpose=batch -F "file=@$IN" "$BASE/files" | jq -r .id)
BODY=$(jq -n --arg f "$FILE_ID" \
  '{input_file_id: $f, endpoint: "/v1/chat/completions", completion_window: "24h"}')
api -H 'Content-Type: application/json' -d "$BODY" "$BASE/batches/estimate" \
  | jq -c '{request_count, max_charge_microusd, credit_sufficient}'
# The key is derived from the upload: re-running this line answers the same batch.
BATCH=$(api -H 'Content-Type: application/json' -H "Idempotency-Key: create-$FILE_ID" \
  -d "$BODY" "$BASE/batches")
BATCH_ID=$(jq -r .id <<<"$BATCH")

delay=1
until jq -e '.status | IN("completed", "failed", "cancelled", "expired")' <<<"$BATCH" >/dev/null; do
  sleep "$delay"; delay=$(( delay < 30 ? delay * 2 : 30 ))
  BATCH=$(api "$BASE/batches/$BATCH_ID")
  jq -r '"\(.status): \(.request_counts.completed)/\(.request_counts.total)"' <<<"$BATCH"
done
echo "batch $BATCH_ID $(jq -r .status <<<"$BATCH")"

# Download with resume: Range from what we have, If-Range with the ETag it came from.
download() {
  local id=$1 dest=$2 part="$2.part" etag="$2.etag" headers status
  headers=$(mktemp)
  if [[ -s $part && -s $etag ]]; then
    api -D "$headers" -H "Range: bytes=$(stat -c %s "$part")-" -H "If-Range: $(cat "$etag")" \
      "$BASE/files/$id/content" -o "$part.new"
  else
    api -D "$headers" "$BASE/files/$id/content" -o "$part.new"
  fi
  status=$(awk 'NR==1 {print $2}' "$headers")
  tr -d '\r' <"$headers" | awk -F': ' 'tolower($1)=="etag" {print $2}' >"$etag"
  if [[ $status == 206 ]]; then cat "$part.new" >>"$part"; else mv "$part.new" "$part"; fi
  rm -f "$part.new" "$headers" "$etag"
  mv "$part" "$dest"
}

STEM=$(basename "$IN" .jsonl)
: >"$OUT/$STEM.seen"
for kind in results errors; do
  field=$([[ $kind == results ]] && echo output_file_id || echo error_file_id)
  id=$(jq -r ".$field // empty" <<<"$BATCH")
  [[ -z $id ]] && continue  # error_file_id is null when nothing failed
  download "$id" "$OUT/$STEM.$kind.jsonl"
  echo "$kind: $OUT/$STEM.$kind.jsonl ($(wc -l <"$OUT/$STEM.$kind.jsonl") rows)"
  jq -r .custom_id "$OUT/$STEM.$kind.jsonl" >>"$OUT/$STEM.seen"
done
REQ=$(head -n1 "$OUT/$STEM.results.jsonl" 2>/dev/null | jq -r '.response.request_id // empty')
[[ -n $REQ ]] && api "$BASE/requests/$REQ" | jq -c '{id, custom_id, usage, charge_microusd}'
MISSING=$(jq -r .custom_id "$IN" | grep -vxF -f "$OUT/$STEM.seen" || true)
rm -f "$OUT/$STEM.seen"
echo "no row: ${MISSING:-none}"
[[ -z $MISSING ]]
