#!/usr/bin/env python3
# Scratch instrumentation for "where the time goes" inside the programs
# (docs/bench-datapath.md, Round 4). Patches a COPY of bpf/ (never the tree):
# bpf_ktime_get_ns() around the steps of the redirected IPv4 TCP path, summed
# in a global array (the object's .bss) that split.sh reads with bpftool while
# the bench runs. Each anchor is asserted, so a source change that moves a step
# fails here instead of measuring the wrong thing.
#
#   instrument.py DIR [noprof] [percpu-stats] [origdst=KIND[:ENTRIES]] [tcp-option]
#     noprof           the timing macros compile to nothing (for A/B runs)
#     percpu-stats     the counters in a BPF_MAP_TYPE_PERCPU_HASH (mc_stats_pc,
#                      filled by the programs themselves: the agent's mc_stats
#                      is left as it is)
#     origdst=KIND     sockops uses mc_origdst2 instead of mc_origdst: KIND is
#                      lru (common LRU), lru-percpu (BPF_F_NO_COMMON_LRU) or
#                      hash (preallocated, no eviction: measurement only);
#                      ENTRIES its size (default 65536). A map of its own name,
#                      so the pod objects the bench loads from build/bpf keep
#                      theirs.
#     tcp-option       the prototype of round 4 (not the datapath): the app's
#                      handshake ACK carries the original destination in a TCP
#                      option (kind 254, magic MC) that the proxy's side reads
#                      at PASSIVE_ESTABLISHED_CB, instead of mc_origdst
# Slots (ns, count): 0 connect4 stats counter, 1 mc_origdst update,
# 2 mc_origdst lookup, 3 mc_origdst delete, 4 mc_skorig creation,
# 5 getsockopt stats counter, 6 an empty lap (the timer's own cost),
# 7 the TCP option's read (tcp-option).
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the tool
d, opts = sys.argv[1], sys.argv[2:]


def edit(path, old, new, every=False):
    s = open(path).read()
    if old not in s:
        sys.exit(f'instrument.py: anchor not found in {path}:\n{old}')
    open(path, 'w').write(s.replace(old, new) if every else s.replace(old, new, 1))


cm, mh = f'{d}/bpf/include/mc_common.h', f'{d}/bpf/include/meshcap.h'
ob, so, og = f'{d}/bpf/outbound.bpf.c', f'{d}/bpf/sockops.bpf.c', f'{d}/bpf/origdst.bpf.c'

if 'tcp-option' in opts:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tcp_option import tcp_option
    tcp_option(so, edit)

if 'noprof' in opts:
    macros = '''#define PROF_T0() do {} while (0)
#define PROF_LAP(i) do {} while (0)
#define PROF_RESET() do {} while (0)'''
else:
    macros = r'''__u64 mc_prof[16];
#define PROF_T0() __u64 __pt = bpf_ktime_get_ns()
#define PROF_LAP(i) do { __u64 __pn = bpf_ktime_get_ns(); __sync_fetch_and_add(&mc_prof[2*(i)], __pn - __pt); __sync_fetch_and_add(&mc_prof[2*(i)+1], 1); __pt = __pn; } while (0)
#define PROF_RESET() __pt = bpf_ktime_get_ns()'''
edit(cm, '#endif /* MC_COMMON_H */', macros + '\n#endif /* MC_COMMON_H */')

if 'percpu-stats' in opts:
    edit(mh, '#endif /* __BPF__ */', '''struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MC_MAX_PODS);
	__type(key, __u64);
	__type(value, struct mc_stats);
} mc_stats_pc SEC(".maps");
#endif /* __BPF__ */''')
    s = open(cm).read()
    i = s.index('#define MC_STAT_INC')
    j = s.index('} while (0)', i) + len('} while (0)')
    open(cm, 'w').write(s[:i] + r'''#define MC_STAT_INC(netns, field)                                            \
	do {                                                                 \
		__u64 __n = (netns);                                         \
		struct mc_stats *__s = bpf_map_lookup_elem(&mc_stats_pc, &__n); \
		if (__s) {                                                   \
			__s->field++;                                        \
		} else {                                                     \
			struct mc_stats __z = {};                            \
			bpf_map_update_elem(&mc_stats_pc, &__n, &__z, BPF_NOEXIST); \
		}                                                            \
	} while (0)''' + s[j:])

edit(ob, '''		orig.kind = MC_ORIG_OUTBOUND;
		MC_STAT_INC(netns, outbound);''', '''		orig.kind = MC_ORIG_OUTBOUND;
		{ PROF_T0(); MC_STAT_INC(netns, outbound); PROF_LAP(0); PROF_RESET(); PROF_LAP(6); }''')
if 'tcp-option' not in opts:  # it has no update
    edit(so, '''		mc_tuple_of(s, o->netns, &t);
		bpf_map_update_elem(&mc_origdst, &t, o, BPF_ANY);
		return;''', '''		mc_tuple_of(s, o->netns, &t);
		{ PROF_T0(); bpf_map_update_elem(&mc_origdst, &t, o, BPF_ANY); PROF_LAP(1); }
		return;''')
edit(so, '''	o = bpf_map_lookup_elem(&mc_origdst, &app);
	if (o) {
		bpf_sk_storage_get(&mc_skorig, sk, o, BPF_SK_STORAGE_GET_F_CREATE);
		bpf_map_delete_elem(&mc_origdst, &app);
	}''', '''	PROF_T0();
	o = bpf_map_lookup_elem(&mc_origdst, &app);
	PROF_LAP(2);
	if (o) {
		bpf_sk_storage_get(&mc_skorig, sk, o, BPF_SK_STORAGE_GET_F_CREATE);
		PROF_LAP(4);
		bpf_map_delete_elem(&mc_origdst, &app);
		PROF_LAP(3);
	}''')
edit(og, '''	ctx->retval = 0;
	MC_STAT_INC(netns, origdst);''', '''	ctx->retval = 0;
	{ PROF_T0(); MC_STAT_INC(netns, origdst); PROF_LAP(5); }''')

for o in opts:
    if not o.startswith('origdst='):
        continue
    kind, _, entries = o[len('origdst='):].partition(':')
    types = {'lru': ('BPF_MAP_TYPE_LRU_HASH', ''), 'lru-percpu': ('BPF_MAP_TYPE_LRU_HASH', '\n\t__uint(map_flags, BPF_F_NO_COMMON_LRU);'),
             'hash': ('BPF_MAP_TYPE_HASH', '')}
    if kind not in types:
        sys.exit(f'instrument.py: origdst kind {kind!r}: lru, lru-percpu or hash')
    t, flags = types[kind]
    edit(mh, '#endif /* __BPF__ */', f'''struct {{
	__uint(type, {t});
	__uint(max_entries, {entries or 65536});{flags}
	__type(key, struct mc_tuple);
	__type(value, struct mc_orig);
}} mc_origdst2 SEC(".maps");
#endif /* __BPF__ */''')
    edit(so, '&mc_origdst,', '&mc_origdst2,', every=True)
