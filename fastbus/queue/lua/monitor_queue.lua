-- monitor_queue: KEYS[1]=P..'ready'  ARGV: P  -> {space(P), now ms}
return {space(ARGV[1]), now_ms()}
