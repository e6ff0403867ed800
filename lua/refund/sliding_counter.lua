-- sliding-counter: the charged window's count goes down by the cost: the
-- current count while the band is still in that window, the previous count
-- once it has moved one window on; further on, it no longer counts.
-- State: `t:s1:c1:p1:s2:c2:p2...` (window start, current, previous count).
state = read_numbers(raw, tail)
for b = 1, state and P_BANDS or 0 do
  local w = args[2 * b]
  local charged = at - at % w
  local start = stored(state[3 * b - 1])
  local i
  if start == charged then
    i = 3 * b
  elseif start == charged + w then
    i = 3 * b + 1
  end
  local count = i and stored(state[i])
  if count then
    state[i] = format('%d', math.max(count - cost, 0))
    changed = true
  end
end
