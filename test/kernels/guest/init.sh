#!/bin/busybox sh
# PID 1 of a test VM (runs from the initramfs built by test/kernels/lib/initramfs.mjs).
# Loads the 9p/virtio modules, mounts the host's root read-only over 9p with a
# tmpfs overlay on top, chroots into it and runs /job/run.sh there, then prints
# the exit code on the console for the host and powers off. It never
# switch_roots: the kernel runs its modprobe helper in this root, where
# busybox modprobe and the kernel's own modules (bind-mounted from the host's
# cache) are.
/bin/busybox mkdir -p /proc /sys /dev /bin /sbin
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev 2>/dev/null
exec </dev/null >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
. /job/env

fail() {
	echo "MESHCAP-INIT-FAIL $NONCE $*"
	poweroff -f
	sleep 60
}

if [ "${KVM_PROBE:-0}" = 1 ]; then
	echo "MESHCAP-KVM-OK $NONCE"
	poweroff -f
	sleep 60
fi

# Early modules, already in dependency order (resolved from modules.dep on the host).
while read -r m; do
	[ -n "$m" ] || continue
	insmod "/lib/modules/early/$m" || fail "insmod $m failed"
done </lib/modules/early/order

mkdir -p /host /newroot /scratch
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host ||
	fail "mount of the host root over 9p (mount_tag hostroot) failed"

# The kernel's module tree for the modprobe helper (and for tests that call modprobe).
mkdir -p "/lib/modules/$RELEASE"
mount --bind "/host$MODULES_DIR" "/lib/modules/$RELEASE" || fail "no modules at $MODULES_DIR"
mkdir -p /sbin && ln -sf /bin/busybox /sbin/modprobe
echo /sbin/modprobe >/proc/sys/kernel/modprobe

mount -t tmpfs -o size=1536m,mode=0755 scratch /scratch
mkdir -p /scratch/upper /scratch/work
ROOTFS=overlay
if ! { modprobe overlay && mount -t overlay rootfs \
	-o lowerdir=/host,upperdir=/scratch/upper,workdir=/scratch/work /newroot; }; then
	# No overlay over 9p on this kernel: read-only root, tmpfs where writes happen.
	ROOTFS=readonly
	mount --bind /host /newroot || fail "bind of /host failed"
	for d in var root; do mount -t tmpfs -o mode=0755 "$d" "/newroot/$d"; done
fi

R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sys $R/sys
mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts
mount -t tmpfs shm $R/dev/shm
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t tmpfs -o mode=0755 run $R/run
# The project may live where the guest has just mounted a fresh tmpfs (a
# clone under /tmp, say): expose it from the host, writable through an overlay
# like the root. The project alone: it reads nothing beside itself.
if [ ! -d "$R$REPO_DIR" ]; then
	mkdir -p "$R$REPO_DIR" /scratch/repo-upper /scratch/repo-work
	if [ "$ROOTFS" = overlay ]; then
		mount -t overlay repo -o "lowerdir=/host$REPO_DIR,upperdir=/scratch/repo-upper,workdir=/scratch/repo-work" "$R$REPO_DIR" ||
			fail "overlay of the project $REPO_DIR failed"
	else
		mount --bind "/host$REPO_DIR" "$R$REPO_DIR" || fail "bind of the project $REPO_DIR failed"
	fi
fi
mount -t bpf bpf $R/sys/fs/bpf || fail "bpffs mount failed"
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup || fail "cgroup2 mount failed"
mount -t tracefs tracefs $R/sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs $R/sys/kernel/debug 2>/dev/null
mkdir -p "$R/lib/modules/$RELEASE" 2>/dev/null && mount --bind "/lib/modules/$RELEASE" "$R/lib/modules/$RELEASE"
# iptables-legacy and friends exec the kernel's modprobe path inside the
# chroot; give the host root one if it has none (no kmod installed).
if [ "$ROOTFS" = overlay ] && [ ! -e $R/sbin/modprobe ]; then
	mkdir -p $R/usr/local/lib/meshcap-vm
	cp /bin/busybox $R/usr/local/lib/meshcap-vm/busybox
	for t in modprobe insmod rmmod lsmod; do ln -s /usr/local/lib/meshcap-vm/busybox "$R/usr/sbin/$t"; done
fi
# bpftool feature probe and friends read /boot/config-$(uname -r).
[ "$ROOTFS" = overlay ] && cp "/host$KERNEL_DIR/boot/config-$RELEASE" "$R/boot/" 2>/dev/null

# Modules the datapath and its tests use; the kernel would autoload most of
# them, loading them here keeps the first test from paying for it.
for m in $PRELOAD_MODULES; do modprobe "$m" 2>/dev/null || echo "meshcap-init: module $m not available"; done

ip link set lo up
hostname meshcap-vm
mkdir -p $R/run/meshcap
cp /job/run.sh $R/run/meshcap/run.sh
echo "MESHCAP-GUEST-UP $NONCE release=$(uname -r) rootfs=$ROOTFS"
chroot $R /bin/sh /run/meshcap/run.sh
rc=$?
echo "MESHCAP-RESULT $NONCE rc=$rc"
sync
poweroff -f
sleep 60
