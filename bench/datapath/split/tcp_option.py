# The TCP-option prototype of round 4 (docs/bench-datapath.md), applied by
# instrument.py with its edit(). Not the datapath: an option rides on one
# segment, so a handshake ACK dropped on a full accept queue loses it.
def tcp_option(so, edit):
    edit(so, '''	o = bpf_sk_storage_get(&mc_apporig, sk, 0, 0);
	if (o) {
		mc_tuple_of(s, o->netns, &t);
		bpf_map_update_elem(&mc_origdst, &t, o, BPF_ANY);
		return;
	}''', '''	o = bpf_sk_storage_get(&mc_apporig, sk, 0, 0);
	if (o)
		return;''')
    edit(so, '''	mc_tuple_of(s, netns, &mine);
	mc_tuple_reverse(&mine, &app);
	o = bpf_map_lookup_elem(&mc_origdst, &app);
	if (o) {''', '''	{
		struct mc_opt opt = { .kind = 254, .len = 4, .m0 = 0x4d, .m1 = 0x43 };
		PROF_T0();
		long n = bpf_load_hdr_opt(s, &opt, sizeof(opt), 0);
		PROF_LAP(7);
		if (n == MC_OPT_LEN4 || n == MC_OPT_LEN6) {
			struct mc_orig orig = {};
			if (n == MC_OPT_LEN4) {
				__u32 a4;
				__builtin_memcpy(&a4, opt.addr, 4);
				mc_v4mapped(orig.addr, a4);
				orig.family = 4;
			} else {
				__builtin_memcpy(orig.addr, opt.addr, 16);
				orig.family = 6;
			}
			orig.port = bpf_ntohs(opt.port);
			orig.kind = MC_ORIG_OUTBOUND;
			orig.netns = netns;
			bpf_sk_storage_get(&mc_skorig, sk, &orig, BPF_SK_STORAGE_GET_F_CREATE);
			PROF_LAP(4);
			return;
		}
	}
	mc_tuple_of(s, netns, &mine);
	mc_tuple_reverse(&mine, &app);
	o = bpf_map_lookup_elem(&mc_origdst, &app);
	if (o) {''')
    edit(so, '''MC_INLINE void mc_on_connect(struct bpf_sock_ops *s)''', '''struct mc_opt {
	__u8 kind, len, m0, m1;
	__u16 port; /* network order */
	__u8 addr[16];
} __attribute__((packed));
#define MC_OPT_LEN4 10
#define MC_OPT_LEN6 22

/* The app's handshake ACK carries the original destination to the proxy's side. */
MC_INLINE void mc_on_active(struct bpf_sock_ops *s)
{
	struct bpf_sock *sk = s->sk;

	if (!sk || !mc_remote_loopback(s))
		return;
	if (!bpf_sk_storage_get(&mc_apporig, sk, 0, 0))
		return;
	bpf_sock_ops_cb_flags_set(s, s->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

MC_INLINE void mc_on_write(struct bpf_sock_ops *s, bool len_only)
{
	struct bpf_sock *sk = s->sk;
	struct mc_opt opt = { .kind = 254, .m0 = 0x4d, .m1 = 0x43 };
	struct mc_orig *o;

	if (!sk)
		return;
	o = bpf_sk_storage_get(&mc_apporig, sk, 0, 0);
	if (!o)
		return;
	if (len_only) {
		bpf_reserve_hdr_opt(s, o->family == 4 ? MC_OPT_LEN4 : MC_OPT_LEN6, 0);
		return;
	}
	opt.port = bpf_htons(o->port);
	if (o->family == 4) {
		opt.len = MC_OPT_LEN4;
		__builtin_memcpy(opt.addr, o->addr + 12, 4);
		bpf_store_hdr_opt(s, &opt, MC_OPT_LEN4, 0);
	} else {
		opt.len = MC_OPT_LEN6;
		__builtin_memcpy(opt.addr, o->addr, 16);
		bpf_store_hdr_opt(s, &opt, MC_OPT_LEN6, 0);
	}
	bpf_sock_ops_cb_flags_set(s, s->bpf_sock_ops_cb_flags & ~BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

MC_INLINE void mc_on_connect(struct bpf_sock_ops *s)''')
    edit(so, '''	case BPF_SOCK_OPS_TCP_LISTEN_CB:''', '''	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		mc_on_active(s);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		mc_on_write(s, true);
		break;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		mc_on_write(s, false);
		break;
	case BPF_SOCK_OPS_TCP_LISTEN_CB:''')
