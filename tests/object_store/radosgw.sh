#!/usr/bin/env bash
# A throw-away Ceph cluster with a RADOS Gateway (S3) for Loom's tests: one
# monitor, one manager, one OSD (BlueStore on a sparse file) and radosgw,
# from Debian 12's packages (ceph-mon ceph-mgr ceph-osd radosgw ceph-common,
# installed by scripts/install-deploy-deps.sh).
#
#   radosgw.sh DIR     starts the cluster with every file under DIR (config,
#                      monitor store, the OSD's block file, logs, sockets),
#                      prints "READY <endpoint> <access key> <secret key>",
#                      then stays in the foreground until killed. Nothing is
#                      written to /etc/ceph or /var/lib/ceph, no systemd, no
#                      kernel module; every daemon binds 127.0.0.1 (the gateway RGW_ADDR) and runs
#                      in the foreground as this script's child with a
#                      parent-death signal, so no daemon outlives the script
#                      (and the test that started it, which gives the script
#                      one too).
#   SIGUSR1            kills the gateway (SIGKILL: a store that vanishes);
#   SIGUSR2            starts it again on the same port and objects;
#   SIGTERM / SIGINT   stops every daemon and removes DIR.
#
# Environment: MON_PORT and RGW_PORT (free loopback ports; the OSD and the
# manager pick their own in 6800-7300), RGW_ADDR (the address the gateway
# alone binds, default 127.0.0.1: a test that runs this script in a network
# namespace of its own gives the namespace's outside address, so that the
# store is reached through that namespace's veth), S3_KEY and S3_SECRET (the
# gateway user's keys), OSD_GIB (the OSD's sparse block file, default 4: BlueStore
# aborts with ENOSPC when it fills, and the gateway frees deleted objects'
# space only at its later garbage collection).
#
# Settings that matter (found bringing it up on a 2-core Debian 12 VM, where
# it answers S3 in about 9 s and idles at ~420 MiB and ~2% of a core):
#   * auth none, and "ms mon client mode = crc secure": with authentication
#     off, daemons otherwise ask the monitor for a secure connection it
#     cannot give, and radosgw retries for 300 s ("get_initial_auth_request
#     returned -13");
#   * "paxos propose interval = 0.05": each monitor command otherwise waits
#     a 1 s consensus round, and the gateway's first start creates six pools;
#   * pools of size 1 with 8 placement groups, no autoscaler.
set -euo pipefail

D=${1:?usage: radosgw.sh DIR}
MON_PORT=${MON_PORT:?set MON_PORT}
RGW_PORT=${RGW_PORT:?set RGW_PORT}
RGW_ADDR=${RGW_ADDR:-127.0.0.1}
KEY=${S3_KEY:-LOOMTESTKEY}
SECRET=${S3_SECRET:-LOOMTESTSECRET}
OSD_GIB=${OSD_GIB:-4}
mkdir -p "$D"/{run,log,mon.a,mgr.x,rgw.a}
CONF=$D/ceph.conf
FSID=$(cat /proc/sys/kernel/random/uuid)
daemons=()
gateway=""
sleeper=""

stop_all() {
  for p in "${daemons[@]}" $gateway $sleeper; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$D"
}
trap 'stop_all; exit 0' TERM INT
trap 'rc=$?; echo "radosgw.sh: failed (exit $rc); logs in $D/log:" >&2;
      tail -n 5 "$D"/log/*.log >&2 2>/dev/null || true; stop_all; exit $rc' ERR

# A daemon in the foreground, as a child that dies with this script.
daemon() { setpriv --pdeathsig KILL "$@" & }

cat > "$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
public addr = 127.0.0.1
public network = 127.0.0.0/8
ms bind msgr1 = false
ms bind ipv6 = false
ms mon client mode = crc secure
ms client mode = crc secure
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
run dir = $D/run
log file = $D/log/\$name.log
admin socket = $D/run/\$name.asok
pid file = $D/run/\$name.pid
crash dir = $D/crash
log to stderr = false
err to stderr = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
mon data avail warn = 2
mon data avail crit = 1
mon osd full ratio = .99
mon osd nearfull ratio = .97
mon osd backfillfull ratio = .98
mon warn on insecure global id reclaim allowed = false
paxos propose interval = 0.05
paxos min wait = 0.01
osd failsafe full ratio = .995
rgw rados pool pg num min = 8

[mon]
mon data = $D/mon.\$id
mon cluster log file = $D/log/cluster.log

[mgr]
mgr data = $D/mgr.\$id

[osd]
osd data = $D/osd.\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $((OSD_GIB << 30))
bluestore block db create = false
bluestore block wal create = false
bluestore fsck on mount = false
bluestore cache autotune = false
bluestore cache size = 134217728
osd memory target = 939524096
osd op num shards = 1
osd op num threads per shard = 2

[client.rgw.a]
rgw frontends = beast endpoint=$RGW_ADDR:$RGW_PORT
rgw data = $D/rgw.a
rgw thread pool size = 32
rgw dns name = $RGW_ADDR
EOF
C=(-c "$CONF")

monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$D/monmap" > /dev/null
ceph-mon "${C[@]}" --mkfs -i a --monmap "$D/monmap"
daemon ceph-mon "${C[@]}" -f -i a 2>> "$D/log/mon.err"
daemons+=($!)
ceph "${C[@]}" --connect-timeout 30 -s > /dev/null
daemon ceph-mgr "${C[@]}" -f -i x 2>> "$D/log/mgr.err"
daemons+=($!)

osd_uuid=$(cat /proc/sys/kernel/random/uuid)
osd_id=$(ceph "${C[@]}" osd new "$osd_uuid")
mkdir -p "$D/osd.$osd_id"
ceph-osd "${C[@]}" -i "$osd_id" --mkfs --osd-uuid "$osd_uuid" > "$D/log/osd-mkfs.out" 2>&1
daemon ceph-osd "${C[@]}" -f -i "$osd_id" 2>> "$D/log/osd.err"
daemons+=($!)
for _ in $(seq 120); do
  ceph "${C[@]}" osd stat 2>/dev/null | grep '1 up' > /dev/null && break
  sleep 0.5
done

# The S3 user (radosgw-admin also creates the gateway's pools).
radosgw-admin "${C[@]}" -n client.rgw.a user create --uid=loom --display-name=loom \
  --access-key="$KEY" --secret="$SECRET" > /dev/null

start_gateway() {
  daemon radosgw "${C[@]}" -f -n client.rgw.a 2>> "$D/log/rgw.err"
  gateway=$!
  for _ in $(seq 300); do
    curl -s -o /dev/null "http://$RGW_ADDR:$RGW_PORT/" && return 0
    kill -0 "$gateway" 2>/dev/null || { tail -n 5 "$D/log/client.rgw.a.log" >&2; return 1; }
    sleep 0.1
  done
  echo "radosgw.sh: the gateway did not answer on $RGW_ADDR:$RGW_PORT within 30 s" >&2
  return 1
}
start_gateway

trap 'kill -9 $gateway 2>/dev/null || true; wait $gateway 2>/dev/null || true; gateway=""' USR1
trap 'start_gateway && echo "GATEWAY UP"' USR2
echo "READY http://$RGW_ADDR:$RGW_PORT $KEY $SECRET"
# Until told to stop; a trapped signal ends `wait`, so wait again.
while true; do
  daemon sleep 3600
  sleeper=$!
  wait "$sleeper" || true
done
