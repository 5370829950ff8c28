//! The kernel-ABI copy helpers of `<infiniband/marshall.h>`. librdmacm
//! imports them to turn the kernel's `rdma_cm` answers into verbs structs;
//! they are plain field copies.

use crate::ffi::*;

unsafe fn ah_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut ibv_ah_attr, src: *mut ib_uverbs_ah_attr) {
    if !dst.is_null() && !src.is_null() {
        ah_from_kern(&mut *dst, &*src);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut ibv_qp_attr, src: *mut ib_uverbs_qp_attr) {
    if dst.is_null() || src.is_null() {
        return;
    }
    let (d, s) = (&mut *dst, &*src);
    d.qp_state = s.qp_state as ibv_qp_state;
    d.cur_qp_state = s.cur_qp_state as ibv_qp_state;
    d.path_mtu = s.path_mtu as ibv_mtu;
    d.path_mig_state = s.path_mig_state as ibv_mig_state;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap.max_send_wr = s.max_send_wr;
    d.cap.max_recv_wr = s.max_recv_wr;
    d.cap.max_send_sge = s.max_send_sge;
    d.cap.max_recv_sge = s.max_recv_sge;
    d.cap.max_inline_data = s.max_inline_data;
    ah_from_kern(&mut d.ah_attr, &s.ah_attr);
    ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(dst: *mut ibv_sa_path_rec, src: *mut ib_user_path_rec) {
    if dst.is_null() || src.is_null() {
        return;
    }
    let (d, s) = (&mut *dst, &*src);
    d.dgid.raw = s.dgid;
    d.sgid.raw = s.sgid;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as i32;
    d.flow_label = s.flow_label;
    d.reversible = s.reversible as i32;
    d.mtu = s.mtu as u8;
    d.pkey = s.pkey;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.numb_path = s.numb_path;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time_selector = s.packet_life_time_selector;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
}
