-- fixed-window: each band's count goes down by the cost if the band is
-- still in the window that was charged; a window since ended needs nothing.
-- State: `t:s1:c1:s2:c2...` (s<b> window start, c<b> count).
state = read_numbers(raw, tail)
for b = 1, state and P_BANDS or 0 do
  local w = args[2 * b]
  local start, count = stored(state[2 * b]), stored(state[2 * b + 1])
  if start and count and start == at - at % w then
    state[2 * b + 1] = format('%d', math.max(count - cost, 0))
    changed = true
  end
end
