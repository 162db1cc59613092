#!/usr/bin/env bash
# debs.sh: HERE (Debian 12, root, apt). The Debian packages a systemd box needs on the GPU machine (systemd 252,
# nspawn, D-Bus, sshd, HAProxy, python3.11 + gi + venv), unpacked and folded into usr/ (the GPU machine is
# merged-/usr Ubuntu: a real /lib in an upper overlay layer would hide its /lib -> usr/lib link), plus sshd's
# configuration and keys, as $G/stage.tgz and $G/manifest.json (per package: files and sonames, so boot.sh
# drops the libraries the machine already has). Derived from ../shared/tools/gpu-box/stage.sh.
#   G=.gpu/box bash scripts/gpubox/debs.sh
set -euo pipefail
G=${G:?set G to the folder to write}
DEBS=$G/debs
ST=${ST:-/tmp/gpubox-stage}
mkdir -p "$DEBS"

# --- packages -------------------------------------------------------------------------------
# Non-library packages: always staged.
CORE="systemd libsystemd-shared systemd-container systemd-sysv
 dbus dbus-bin dbus-daemon dbus-system-bus-common dbus-session-bus-common
 openssh-server openssh-client openssh-sftp-server haproxy iproute2
 python3.11 python3.11-minimal libpython3.11-stdlib libpython3.11-minimal python3-gi gir1.2-glib-2.0
 libaudit-common libtirpc-common
 python3.11-venv python3-pip-whl python3-setuptools-whl"
# Library packages: staged, then dropped on the GPU machine when it already has their sonames.
LIBS="libapparmor1 libargon2-1 libbpf1 libcbor0.8 libcryptsetup12 libdbus-1-3 libdevmapper1.02.1 libfdisk1
 libgirepository-1.0-1 libglib2.0-0 libip4tc2 libjson-c5 libkmod2 liblua5.3-0 libmnl0 libnsl2 libopentracing-c-wrapper0
 libopentracing1 libtirpc3 libwrap0 libxtables12"
if [ "${SKIP_DOWNLOAD:-0}" != 1 ]; then
  apt-get update -qq
  rm -f "$DEBS"/*.deb
  (cd "$DEBS" && apt-get download $CORE $LIBS 2>&1 | grep -v '^Get:' || true)
fi
ls "$DEBS"/*.deb | wc -l | sed 's/^/debs: /'
du -cb "$DEBS"/*.deb | tail -1 | awk '{printf "debs total: %.1f MiB\n", $1/1048576}'

# --- unpack + fold into usr/ ----------------------------------------------------------------
rm -rf "$ST"; mkdir -p "$ST"
for f in "$DEBS"/*.deb; do dpkg-deb -x "$f" "$ST"; done
for d in lib bin sbin; do
  if [ -d "$ST/$d" ] && [ ! -L "$ST/$d" ]; then
    mkdir -p "$ST/usr/$d"; cp -a "$ST/$d/." "$ST/usr/$d/"; rm -rf "$ST/$d"
  fi
done
[ -e "$ST/lib64" ] && { echo "unexpected lib64 in staging"; exit 1; }
rm -rf "$ST"/usr/share/{doc,man,info,locale,lintian,bash-completion,zsh,fish}

# --- manifest: per package, post-fold file list and sonames ----------------------------------
python3 - "$DEBS" "$ST" "$G/manifest.json" "$LIBS" <<'PY'
import json, os, subprocess, sys
debs, st, out, libs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
def fold(p):
    p = p[2:] if p.startswith("./") else p
    for d in ("lib/", "bin/", "sbin/"):
        if p.startswith(d): return "usr/" + p
    return p
man = {}
for f in sorted(os.listdir(debs)):
    if not f.endswith(".deb"): continue
    pkg = subprocess.check_output(["dpkg-deb", "-f", os.path.join(debs, f), "Package"], text=True).strip()
    lines = subprocess.check_output(["dpkg-deb", "-c", os.path.join(debs, f)], text=True).splitlines()
    files, sonames = [], []
    for l in lines:
        if l.startswith("d"): continue
        path = l.split(None, 5)[5].split(" -> ")[0]
        fp = fold(path)
        if not os.path.lexists(os.path.join(st, fp)): continue   # stripped docs
        files.append(fp)
        real = os.path.join(st, fp)
        if "/x86_64-linux-gnu/" in fp and ".so" in fp and os.path.isfile(real) and not os.path.islink(real):
            try:
                dyn = subprocess.check_output(["objdump", "-p", real], text=True, stderr=subprocess.DEVNULL)
                for d in dyn.splitlines():
                    if d.strip().startswith("SONAME"):
                        sonames.append(d.split()[1])
            except subprocess.CalledProcessError:
                pass
    man[pkg] = {"deb": f, "size": os.path.getsize(os.path.join(debs, f)),
                "prunable": pkg in libs, "files": files, "sonames": sorted(set(sonames))}
json.dump(man, open(out, "w"), indent=1)
print("manifest:", len(man), "packages;", sum(len(v["files"]) for v in man.values()), "files")
PY

# --- probe configuration baked into the staging layer ----------------------------------------
# default target: multi-user; sshd enabled (no postinst ran, so no enablement symlinks exist)
mkdir -p "$ST/etc/systemd/system/multi-user.target.wants"
ln -sfn /lib/systemd/system/multi-user.target "$ST/etc/systemd/system/default.target"
ln -sfn /lib/systemd/system/ssh.service "$ST/etc/systemd/system/multi-user.target.wants/ssh.service"
# sshd: main config (postinst normally writes it) + a listen drop-in set before boot
mkdir -p "$ST/etc/ssh/sshd_config.d"
cat > "$ST/etc/ssh/sshd_config" <<'EOF'
Include /etc/ssh/sshd_config.d/*.conf
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
X11Forwarding no
PrintMotd no
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
cat > "$ST/etc/ssh/sshd_config.d/10-gsd-listen.conf" <<'EOF'
# set before boot: sshd answers only on a loopback alias
ListenAddress 127.0.0.2:2222
EOF
rm -f "$ST"/etc/ssh/ssh_host_* "$G"/client_ed25519*
ssh-keygen -q -t ed25519 -N '' -C gsd-host -f "$ST/etc/ssh/ssh_host_ed25519_key"
ssh-keygen -q -t ed25519 -N '' -C gsd-client -f "$G/client_ed25519"
install -d -m 700 "$ST/root" "$ST/root/.ssh"
install -m 600 "$G/client_ed25519.pub" "$ST/root/.ssh/authorized_keys"
install -m 600 "$G/client_ed25519" "$ST/root/.ssh/gsd_client_ed25519"
# (everything is already root-owned: extracted and written as root; no chown, it would clear setuid bits)
tar -C "$ST" --numeric-owner -czf "$G/stage.tgz" .
du -sh "$ST" | sed 's/^/staging tree: /'
ls -l "$G/stage.tgz" | awk '{printf "stage.tgz: %.1f MiB\n", $5/1048576}'
