-- acm.lua: a Wireshark/tshark postdissector for ibacm's address resolution MAD
-- (management class 0x2C, `struct acm_mad` + `acm_resolve_rec` of rdma-core's
-- ibacm/include/acm_mad.h, big-endian), which Wireshark 4.0 has no dissector for.
--
--   tshark -X lua_script:tools/madtool/acm.lua -r capture.pcap -V
--   tshark -X lua_script:tools/madtool/acm.lua -r capture.pcap -Y acm \
--          -T fields -e acm.method -e acm.tid -e acm.dest_name -e acm.gid
--
-- It runs after the InfiniBand dissector and looks at the UD payload (after the DETH and any
-- ImmDt, up to the ICRC minus the BTH pad): 256 bytes or more with BaseVersion 1 and class
-- 0x2C are decoded. ibacm sends these on its own UD QP (Q_Key 0x80010000), so Wireshark shows
-- the payload as "Data"; on QP 0/1 it would be an "Application Specific MAD": both work.
-- Layout (offsets in the MAD): 0 BaseVersion 1 MgmtClass 2 ClassVersion 3 Method 4 Status
-- 6 Control 8 TID | 16 dest_type 17 dest_length 18 src_type 19 src_length 20 gid_cnt
-- 21 resp_resources 22 init_depth 23 reserved 24 dest[64] 88 src[64] 152 gid[0..5] (16 each).

local acm = Proto("acm", "ibacm address resolution (MAD class 0x2C)")

local methods = { [0x01] = "GET", [0x81] = "GET_RESP" }
local controls = { [0x0001] = "RESOLVE", [0x8001] = "RESOLVE|ACK" }
local addr_types = { [0] = "Invalid", [1] = "Name", [2] = "IP", [3] = "IP6", [4] = "GID", [5] = "LID" }

local F = acm.fields
F.base_version = ProtoField.uint8("acm.base_version", "BaseVersion", base.DEC)
F.mgmt_class = ProtoField.uint8("acm.mgmt_class", "MgmtClass", base.HEX)
F.class_version = ProtoField.uint8("acm.class_version", "ClassVersion", base.DEC)
F.method = ProtoField.uint8("acm.method", "Method", base.HEX, methods)
F.status = ProtoField.uint16("acm.status", "Status", base.HEX)
F.control = ProtoField.uint16("acm.control", "Control", base.HEX, controls)
F.tid = ProtoField.uint64("acm.tid", "TransactionID", base.HEX)
F.gid_cnt = ProtoField.uint8("acm.gid_cnt", "GIDCount", base.DEC)
F.resp_resources = ProtoField.uint8("acm.resp_resources", "RespResources", base.DEC)
F.init_depth = ProtoField.uint8("acm.init_depth", "InitDepth", base.DEC)
F.reserved = ProtoField.uint8("acm.reserved", "Reserved", base.HEX)
F.gid = ProtoField.ipv6("acm.gid", "GID")

-- dest_* and src_*: type, length and the address shown according to its type.
local function addr_fields(p, title)
    return {
        type = ProtoField.uint8("acm." .. p .. "_type", title .. "Type", base.DEC, addr_types),
        length = ProtoField.uint8("acm." .. p .. "_length", title .. "Length", base.DEC),
        name = ProtoField.string("acm." .. p .. "_name", title .. " (name)"),
        ip = ProtoField.ipv4("acm." .. p .. "_ip", title .. " (IPv4)"),
        ip6 = ProtoField.ipv6("acm." .. p .. "_ip6", title .. " (IPv6)"),
        gid = ProtoField.ipv6("acm." .. p .. "_gid", title .. " (GID)"),
        lid = ProtoField.uint16("acm." .. p .. "_lid", title .. " (LID)", base.DEC),
        raw = ProtoField.bytes("acm." .. p .. "_raw", title),
    }
end
local DEST = addr_fields("dest", "Dest")
local SRC = addr_fields("src", "Src")
for k, f in pairs(DEST) do
    F["dest_" .. k] = f
end
for k, f in pairs(SRC) do
    F["src_" .. k] = f
end

local f_deth = Field.new("infiniband.deth")
local f_immdt = Field.new("infiniband.immdt")
local f_icrc = Field.new("infiniband.invariant.crc")
local f_pad = Field.new("infiniband.bth.padcnt")

local MAD_LEN = 256

-- Adds the address at `r` (64 bytes) of type `t`; returns it as text for the Info column.
local function add_addr(tree, set, t, r)
    if t == 1 then
        tree:add(set.name, r, r:stringz())
        return r:stringz()
    elseif t == 2 then
        tree:add(set.ip, r(0, 4))
        return tostring(r(0, 4):ipv4())
    elseif t == 3 then
        tree:add(set.ip6, r(0, 16))
        return tostring(r(0, 16):ipv6())
    elseif t == 4 then
        tree:add(set.gid, r(0, 16))
        return tostring(r(0, 16):ipv6())
    elseif t == 5 then
        tree:add(set.lid, r(0, 2))
        return tostring(r(0, 2):uint())
    end
    tree:add(set.raw, r)
    return "-"
end

function acm.dissector(tvb, pinfo, tree)
    local deth = f_deth()
    if not deth then
        return
    end
    local start = deth.offset + deth.len
    local imm = f_immdt()
    if imm then
        start = imm.offset + imm.len
    end
    local stop = tvb:len()
    local icrc = f_icrc()
    if icrc then
        stop = icrc.offset
        local pad = f_pad()
        if pad then
            stop = stop - pad.value
        end
    end
    if stop - start < MAD_LEN or tvb(start, 1):uint() ~= 1 or tvb(start + 1, 1):uint() ~= 0x2c then
        return
    end
    local m = tvb(start, MAD_LEN)
    local t = tree:add(acm, m)
    t:add(F.base_version, m(0, 1))
    t:add(F.mgmt_class, m(1, 1))
    t:add(F.class_version, m(2, 1))
    t:add(F.method, m(3, 1))
    t:add(F.status, m(4, 2))
    t:add(F.control, m(6, 2))
    t:add(F.tid, m(8, 8))
    local rec = t:add(acm, m(16, MAD_LEN - 16), "Resolve record")
    local dtype, stype = m(16, 1):uint(), m(18, 1):uint()
    rec:add(DEST.type, m(16, 1))
    rec:add(DEST.length, m(17, 1))
    rec:add(SRC.type, m(18, 1))
    rec:add(SRC.length, m(19, 1))
    rec:add(F.gid_cnt, m(20, 1))
    rec:add(F.resp_resources, m(21, 1))
    rec:add(F.init_depth, m(22, 1))
    rec:add(F.reserved, m(23, 1))
    local dest = add_addr(rec, DEST, dtype, m(24, 64))
    local src = add_addr(rec, SRC, stype, m(88, 64))
    local cnt = m(20, 1):uint()
    if cnt > 6 then
        rec:add_expert_info(PI_MALFORMED, PI_ERROR, "gid_cnt " .. cnt .. " > 6 (only 6 GIDs fit)")
        cnt = 6
    end
    for i = 0, cnt - 1 do
        rec:add(F.gid, m(152 + 16 * i, 16))
    end
    local method = m(3, 1):uint()
    pinfo.cols.protocol = "ACM"
    pinfo.cols.info = string.format("ACM %s %s tid 0x%s dest %s src %s gid_cnt %d",
        methods[method] or string.format("0x%02x", method),
        controls[m(6, 2):uint()] or string.format("0x%04x", m(6, 2):uint()),
        m(8, 8):bytes():tohex(), dest, src, m(20, 1):uint())
end

-- true: the InfiniBand tree (and so the DETH/ICRC fields above) is built on every pass.
register_postdissector(acm, true)
